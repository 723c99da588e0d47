"""Root causes over their echoes, every bar its own bar, phases from frames, start-up errors.

Lines are real: from the corpus (tests/data/corpus/) or, where a test needs a variant, vLLM's and
torch's own format strings around them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from probe_helpers import events_of

from supervisor.core.errors import ProbePackError
from supervisor.core.events import Event, EventKind, FailureKind, Phase, Verdict
from supervisor.probes import load_packs, replay_file
from supervisor.probes._pack import parse_pack
from supervisor.probes._replay import build_report
from supervisor.spec.model import HealthSpec
from supervisor.watchdog import Watchdog

CORPUS = Path(__file__).parent / "data" / "corpus"
DEVICE = CORPUS / "device-logs"
PACKS = load_packs()

# vLLM 0.9-0.11: the engine core's own exception, its echo, and the API server's.
CORE = "(EngineCore_DP0 pid=494) ERROR 05-20 00:55:13 [core.py:1100] "
API = "(APIServer pid=1) "
VLLM_STARTUP_FAILURE = [
    "(EngineCore_DP0 pid=494) INFO 05-20 00:55:10 [gpu_worker.py:276] Available KV cache memory: 2.34 GiB",
    f"{CORE}EngineCore failed to start.",
    f"{CORE}Traceback (most recent call last):",
    f'{CORE}  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 83, in __init__',
    f"{CORE}    self._initialize_kv_caches(vllm_config)",
    (f"{CORE}ValueError: To serve at least one request with the models's max seq len (131072), (16.00 GiB KV cache "
     "is needed, which is larger than the available KV cache memory (2.34 GiB). Based on the available memory, the "
     "estimated maximum model length is 19184. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
     "when initializing the engine."),
    f"{API}Traceback (most recent call last):",
    f'{API}  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/utils.py", line 759, in wait_for_engine_startup',
    f'{API}    raise RuntimeError("Engine core initialization failed. "',
    f"{API}RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {{}}",
]


# ---- root cause ------------------------------------------------------------------------


def test_the_engine_cores_error_is_the_failure_not_its_echoes() -> None:
    events = events_of(VLLM_STARTUP_FAILURE)
    found = [e.failure for e in events if e.failure is not None]
    assert [(f.consequence, f.line.split(":")[0]) for f in found] == [
        (True, "ERROR 05-20 00"), (False, "ValueError"), (True, "RuntimeError")]
    report = build_report(events)
    assert report.failure is not None and report.failure.line.startswith("ValueError: To serve at least one request")
    # Raised while sizing the KV cache: wrong settings, not a broken box.
    assert report.failure.kind is FailureKind.CONFIG_ERROR


def test_only_echoes_logged_still_name_a_failure() -> None:
    report = build_report(events_of([VLLM_STARTUP_FAILURE[1], VLLM_STARTUP_FAILURE[-1]]))
    assert report.failure is not None and report.failure.line.endswith("EngineCore failed to start.")


def test_torchrun_summary_is_a_consequence_of_the_ranks_traceback() -> None:
    report = replay_file(DEVICE / "run-torchrun-rank1-valueerror-startup.log")
    echoes = [e for e in report.events if e.failure is not None and e.line != report.failure.line]
    assert report.failure is not None and report.failure.line.startswith("ValueError: unsupported lr schedule")
    assert {e.probe for e in echoes} == {"torch.rank_failed", "python.traceback"}  # the agent, ChildFailedError
    assert report.failure.kind is FailureKind.CONFIG_ERROR  # after torchrun's start-up banner


def test_a_sigkilled_rank_is_named_by_the_agent() -> None:
    report = replay_file(DEVICE / "run-torchrun-rank0-sigkill.log")
    assert report.failure is not None and report.failure.kind is FailureKind.KILLED
    assert "failed (exitcode: -9) local_rank: 0" in report.failure.line


def test_a_peers_gloo_reset_before_the_agents_report_yields_to_the_sigkilled_rank() -> None:
    # A real log (rank 0 SIGKILLed at step 6): rank 1's gloo "Connection reset by peer" traceback reaches the
    # log before the agent's report of the killed rank, as it did for a two-rank train on a busy box.
    lines = (CORPUS / "wave4-logs" / "15-slurm-torchrun-sigkill-restart-then-two-task-crash.log").read_text(
        encoding="utf-8").splitlines()[:27]
    assert "Connection reset by peer" in lines[24] and "failed (exitcode: -9) local_rank: 0" in lines[26]
    events = events_of(lines)
    reset = [e.failure for e in events if e.failure is not None and "Connection reset by peer" in e.line]
    assert reset and all(f.consequence for f in reset)
    report = build_report(events)
    assert report.failure is not None and report.failure.kind is FailureKind.KILLED
    assert "failed (exitcode: -9) local_rank: 0" in report.failure.line


def test_nccl_watchdog_follow_ups_are_consequences_of_the_first_timeout() -> None:
    report = replay_file(CORPUS / "full-logs" / "04-deepspeed-nccl-watchdog-timeout.log")
    assert report.failure is not None and "[Rank 0] Watchdog caught collective operation timeout" in report.failure.line
    follow_ups = [e for e in report.events if "watchdog thread terminated" in e.line or "DistBackendError'" in e.line]
    assert follow_ups and all(e.probe == "nccl.watchdog_terminated" for e in follow_ups)


def test_a_wrapper_quoting_its_cause_yields_to_it() -> None:
    report = replay_file(DEVICE / "run-hf-config-valueerror.log")
    assert report.failure is not None
    assert report.failure.line == "ValueError: The hidden size (128) is not a multiple of the number of attention heads (6)."
    assert (report.failure.kind, report.last_phase) == (FailureKind.CONFIG_ERROR, Phase.CONFIG)


def test_the_watchdog_stores_and_blames_the_root_cause() -> None:
    watchdog = Watchdog(HealthSpec(), clock=lambda: 0.0)
    for event in events_of(VLLM_STARTUP_FAILURE):
        watchdog.observe(Event(job="j", attempt=1, kind=EventKind(event.kind.value), message=event.line,
                               probe=event.probe, phase=event.phase, data=event.fields, failure=event.failure))
    assert watchdog.failure is not None and watchdog.failure.line.startswith("ValueError: To serve")
    assert watchdog.state().failure == watchdog.failure
    judgement = watchdog.exited(1, None, killed_by_us=False)
    assert judgement.verdict is Verdict.CRASHED and "ValueError: To serve" in judgement.reason
    assert judgement.evidence.to_json()["fingerprint"] == watchdog.failure.fingerprint


# ---- start-up errors ---------------------------------------------------------------------


@pytest.mark.parametrize(("before", "kind"), [
    ("INFO 05-23 09:31:22 [loader.py:458] Loading weights took 38.52 seconds", FailureKind.CONFIG_ERROR),
    (("INFO 08-10 12:00:01 [metrics.py:455] Avg prompt throughput: 12.0 tokens/s, Avg generation throughput: "
      "30.1 tokens/s, Running: 1 reqs"), FailureKind.VALUE_ERROR),
    ("", FailureKind.VALUE_ERROR),  # nothing says whether it had started: no guess
])
def test_value_errors_raised_while_starting_up_are_config_errors(before: str, kind: FailureKind) -> None:
    lines = [before, "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
             "ValueError: Tokenizer not available when `skip_tokenizer_init=True`"]
    (failure,) = [e.failure for e in events_of([line for line in lines if line]) if e.failure is not None]
    assert failure.kind is kind


# ---- phases from frames ----------------------------------------------------------------


def test_a_crash_inside_init_process_group_happened_in_distributed_init() -> None:
    report = replay_file(DEVICE / "run-torch-store-timeout.log")
    assert report.last_phase is Phase.DISTRIBUTED_INIT
    assert report.failure is not None and report.failure.kind is FailureKind.DISTRIBUTED_TIMEOUT


def test_torchrun_and_nccl_start_up_lines_are_distributed_init() -> None:
    fsdp = replay_file(DEVICE / "run-torchrun-fsdp-nccl-debug-done.log")
    nccl = [e for e in fsdp.events if e.probe == "nccl.info"]
    assert nccl and nccl[0].phase is Phase.DISTRIBUTED_INIT
    assert any("NCCL version 2.28.9" in e.line for e in nccl)


# ---- every bar its own bar -----------------------------------------------------------------


def test_each_ranks_bar_and_each_evaluation_bar_is_listed() -> None:
    ranks = replay_file(DEVICE / "run-torchrun-ddp-gloo-2rank-done.log").progress
    assert [(p.bar, p.done, p.total) for p in ranks] == [
        ("train rank 1 (tee=default1)", 30, 30), ("train rank 0 (tee=default0)", 30, 30),
        ("training.step (tee=default0)", 20, None)]  # rank 0's own `step N loss X` lines, a bar of their own
    trainer = replay_file(DEVICE / "run-hf-trainer-eval-bars-done.log").progress
    assert [(p.done, p.total) for p in trainer] == [(40, 40), (32, 32), (32, 32), (32, 32)]


def test_a_draft_models_shards_after_the_targets_are_a_second_bar() -> None:
    report = replay_file(CORPUS / "full-logs" / "08-vllm-tp2-specdecode-ready.log")
    shards = [(p.done, p.total) for p in report.progress if p.probe == "vllm.shards"]
    assert shards == [(48, 48), (48, 48)]


def test_a_bar_line_without_its_prefix_continues_the_prefixed_bar() -> None:
    report = replay_file(CORPUS / "vllm-logs" / "08-ansi-worker-prefix-shards.log")
    assert [(p.process, p.done, p.total) for p in report.progress] == [("VllmWorker rank=0 pid=226", 15, 37)]


def test_the_watchdog_keeps_one_stall_track_per_rank() -> None:
    clock = [0.0]
    watchdog = Watchdog(HealthSpec(stall_floor_s=10), clock=lambda: clock[0])

    def step(rank: int, done: int, at: float) -> None:
        clock[0] = at
        watchdog.observe(Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="bar", probe="tqdm.bar",
                               data={"desc": "Loading weights", "proc": f"Worker_TP{rank}", "pid": 100 + rank,
                                     "done": done, "total": 8}))

    step(0, 1, 0.0)
    step(1, 1, 0.0)
    for i in range(2, 8):  # rank 0 advances; rank 1 stays at 1/8
        step(0, i, float(i))
    judgement = watchdog.check(10.5)
    assert judgement.verdict is Verdict.STALLED
    assert judgement.evidence.to_json()["bar"] == "Loading weights (Worker_TP1 pid=101)"


# ---- the pack format -----------------------------------------------------------------------


def test_consequence_is_for_failure_probes_and_frames_need_a_known_phase() -> None:
    with pytest.raises(ProbePackError, match="'consequence' is only for probes of kind 'failure'"):
        parse_pack({"name": "p", "probes": [{"id": "x", "kind": "phase", "regex": "a", "consequence": True}]}, "p.toml")
    with pytest.raises(ProbePackError, match=r"frame rule 1 .*unknown phase 'loading'"):
        parse_pack({"name": "p", "frames": [{"phase": "loading", "regex": "a"}]}, "p.toml")
    pack = parse_pack({"name": "p", "frames": [{"phase": "weight_loading", "regex": ", in load$"}],
                       "probes": [{"id": "x", "kind": "failure", "failure": "other", "regex": "a", "consequence": True}]},
                      "p.toml")
    assert pack.probes[0].consequence and pack.frames[0].phase is Phase.WEIGHT_LOADING
