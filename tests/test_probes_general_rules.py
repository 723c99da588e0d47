"""General rules for logs nobody here has seen (issue: probes on unseen logs, round 2): each is a
rule about a kind of line, whatever the program, checked on lines that must match and on
near-misses that must not.  The real logs that show each are in tests/data/corpus/wave3-logs/."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core.events import Event, EventKind, FailureKind, Outcome, Phase
from supervisor.core.records import Record
from supervisor.probes import ProbeEngine, load_packs, replay_file
from supervisor.watchdog._facts import Facts


def replay(tmp_path: Path, lines: list[str]):
    log = tmp_path / "job.log"
    log.write_text("".join(line + "\n" for line in lines))
    return replay_file(log)


@pytest.mark.parametrize("line", [
    "Accelerate launch command: error: argument --machine_rank/--machine-rank: invalid int value: ''",
    "api_server.py: error: unrecognized arguments: --attention-backend FLASHINFER",
    "train.py: error: the following arguments are required: --model",
    "error: argument --lr: invalid float value: 'x'",
])
def test_an_argparse_refusal_is_a_config_error_at_start_up_whatever_the_program(tmp_path: Path, line: str) -> None:
    report = replay(tmp_path, ["usage: prog [-h] [--model MODEL]", "            [--lr LR]", line])
    assert report.outcome is Outcome.CRASHED and report.failure is not None
    assert report.failure.kind is FailureKind.CONFIG_ERROR and report.last_phase is Phase.STARTUP


@pytest.mark.parametrize("line", [
    "RuntimeError: argument 1 must be a Tensor",  # an exception, not argparse
    "INFO: no error: argument parsing went fine",
])
def test_lines_that_only_look_like_usage_errors_are_not(tmp_path: Path, line: str) -> None:
    report = replay(tmp_path, [line])
    assert report.failure is None or report.failure.kind is not FailureKind.CONFIG_ERROR


@pytest.mark.parametrize("line,kind", [
    ("*** SIGTERM received at time=1748300290 on cpu 8 ***", FailureKind.KILLED),
    ("[2025-05-26 18:58:10,599 E 629624 629624] logging.cc:496: *** SIGTERM received at time=1748300290 on cpu 8 ***",
     FailureKind.KILLED),
    ("[2026-01-29T04:03:03.675] error: *** JOB 23859577 ON gpu-110 CANCELLED AT 2026-01-29T04:03:03 DUE to SIGNAL "
     "Terminated ***", FailureKind.KILLED),
    ("slurmstepd: error: *** STEP 267039.0 ON dgx-06 CANCELLED AT 2025-08-21T02:53:05 DUE TO TIME LIMIT ***",
     FailureKind.KILLED),
])
def test_a_termination_from_outside_is_killed(tmp_path: Path, line: str, kind: FailureKind) -> None:
    report = replay(tmp_path, ["starting", line])
    assert report.failure is not None and report.failure.kind is kind, report.failure


def test_keyboard_interrupt_terminated_is_a_sigterm_and_a_bare_one_is_not_said_to_be(tmp_path: Path) -> None:
    tb = ["Traceback (most recent call last):", '  File "x.py", line 3, in <module>', "    main()"]
    assert replay(tmp_path, [*tb, "KeyboardInterrupt: terminated"]).failure.kind is FailureKind.KILLED  # type: ignore[union-attr]
    assert replay(tmp_path, [*tb, "KeyboardInterrupt"]).failure.kind is FailureKind.OTHER  # type: ignore[union-attr]


@pytest.mark.parametrize("device", ["NPU", "HIP", "XPU", "MPS", "CUDA"])
def test_out_of_memory_on_any_accelerator_is_an_oom(tmp_path: Path, device: str) -> None:
    report = replay(tmp_path, [f"RuntimeError: {device} out of memory. Tried to allocate 4.00 GiB"])
    assert report.outcome is Outcome.OOM and report.failure.kind is FailureKind.CUDA_OOM  # type: ignore[union-attr]


def test_mps_words_its_out_of_memory_its_own_way(tmp_path: Path) -> None:
    line = "RuntimeError: MPS backend out of memory (MPS allocated: 8.00 GB, other allocations: 1.00 GB)"
    assert replay(tmp_path, [line]).failure.kind is FailureKind.CUDA_OOM  # type: ignore[union-attr]


def test_the_what_line_of_an_uncaught_cpp_exception_is_the_root_cause_not_the_bar_it_was_glued_to(tmp_path: Path) -> None:
    report = replay(tmp_path, [
        "Capture npu graph begin. This can take up to several minutes.",
        "Capturing batches (bs=22 avail_mem=1.84 GB):  11%|█         | 1/9 [00:23<03:10, 23.87s/it] terminate called "
        "after throwing an instance of 'c10::Error'",
        "  what():  NPU out of memory. Tried to allocate 4.00 GiB (NPU 4; 61.27 GiB total capacity)",
    ])
    assert report.failure is not None and report.failure.kind is FailureKind.CUDA_OOM
    assert report.failure.line.strip().startswith("what():  NPU out of memory")
    assert report.last_phase is Phase.CUDA_GRAPH_CAPTURE and report.outcome is Outcome.OOM


def test_vllm_v0_engine_and_ray_placement_group_waits_are_phases(tmp_path: Path) -> None:
    report = replay(tmp_path, [
        "INFO 05-26 18:53:50 [llm_engine.py:240] Initializing a V0 LLM engine (v0.8.5.post1) with config: model='Q'",
        "INFO 05-26 18:54:03 [ray_utils.py:233] Waiting for creating a placement group of specs for 10 seconds. specs=[]",
    ])
    assert report.last_phase is Phase.DISTRIBUTED_INIT and report.failure is None


@pytest.mark.parametrize("desc", ["Training Progress", "Training", "train", "Epoch 3/10", "epoch"])
def test_a_bar_that_says_it_is_training_is_running_phase_progress(tmp_path: Path, desc: str) -> None:
    report = replay(tmp_path, [f"{desc}:   0%|          | {i}/15625 [34:38<288:57:10, 66.71s/it]" for i in (31, 32, 33)])
    assert report.last_phase is Phase.RUNNING
    assert [(p.done, p.total) for p in report.progress] == [(33, 15625)]


@pytest.mark.parametrize("desc", ["Pretraining data", "Map", "Tokenizing train dataset", "Downloading"])
def test_other_bars_name_no_phase(tmp_path: Path, desc: str) -> None:
    assert replay(tmp_path, [f"{desc}:  50%|#####     | 5/10 [00:01<00:01, 5.0it/s]"]).last_phase is None


@pytest.mark.parametrize("last", [
    "[2025-09-26 16:59:24,789] [INFO] [launch.py:351:main] Process 4657 exits successfully.",
    "Application 1bb8e45c resources: utime=188s stime=106s maxrss=3534612KB inblock=1629772 oublock=506784",
])
def test_a_launchers_clean_summary_is_done_and_not_after_a_crash(tmp_path: Path, last: str) -> None:
    done = replay(tmp_path, ["Epoch 1:  100%|##########| 10/10 [00:01<00:00, 9.0it/s]", last])
    assert done.outcome is Outcome.DONE and done.last_phase is Phase.DONE
    crashed = replay(tmp_path, ["Traceback (most recent call last):", '  File "t.py", line 1, in <module>',
                                "ValueError: bad batch", last])
    assert crashed.outcome is Outcome.CRASHED


def test_a_failure_the_program_went_on_from_is_not_the_root_cause_of_a_later_end(tmp_path: Path) -> None:
    report = replay(tmp_path, [
        "ERROR 01-29 03:10:00 [x.py:1] huggingface_hub.errors.HFValidationError: Repo id must be in the form 'x'",
        "Loading checkpoint shards:  50%|#####     | 1/2 [00:01<00:01, 1.0it/s]",
        "Loading checkpoint shards: 100%|##########| 2/2 [00:02<00:00, 1.0it/s]",
        "slurmstepd: error: *** JOB 267039 ON dgx-06 CANCELLED AT 2025-08-21T02:53:05 ***",
    ])
    assert report.failure is not None and report.failure.kind is FailureKind.KILLED, report.failure


def _events(lines: list[str]) -> list[Event]:
    engine = ProbeEngine(load_packs(None))
    offset, found = 0, []
    for text in lines:
        record = Record(text, offset, offset + len(text) + 1)
        offset = record.end
        found += engine.feed(record)
    found += engine.flush()
    return [Event(job="j", attempt=1, kind=EventKind(e.kind.value), message=e.line, probe=e.probe, phase=e.phase,
                  data=dict(e.fields), failure=e.failure) for e in found]


@pytest.mark.parametrize("line", [
    "step 31/80 loss 1.0",
    "Step 31/80 | loss: 1.0",
    "[rank0] step=31/80, loss=1.0e+00",
    "step 31 loss 1.0",
    "steps: 31 loss: 1.0000 iter time (s): 0.063 samples/sec: 253.011",  # DeepSpeed's pipeline engine
])
def test_a_trainers_own_step_loss_line_is_running_phase_progress_with_its_loss(tmp_path: Path, line: str) -> None:
    report = replay(tmp_path, [line.replace("31", "30"), line])
    assert report.last_phase is Phase.RUNNING
    assert [p.done for p in report.progress] == [31]
    assert all(e.probe == "training.step" and e.kind.value == "progress" for e in _events([line]))
    assert _events([line])[0].data["loss"] == 1.0  # the divergence rule reads it


@pytest.mark.parametrize("line", ["loss 1.0 at step 31", "stepping 31/80 loss 1.0", "steps: 31/80 lossless"])
def test_lines_that_only_mention_steps_and_loss_are_not_step_progress(tmp_path: Path, line: str) -> None:
    assert not [e for e in _events([line]) if e.probe == "training.step"]


TORCHRUN_SUMMARY = [
    "E1203 23:26:11.299000 6952 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) "
    "local_rank: 1 (pid: 6958) of binary: /usr/bin/python3",
    "Traceback (most recent call last):", '  File "/usr/bin/torchrun", line 8, in <module>', "    sys.exit(main())",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
]
RANK1_CRASH = ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "train.py", line 3, in <module>',
               "[rank1]: RuntimeError: data shard 3: unexpected end of file"]


def test_a_worker_that_fails_and_a_restart_that_trains_on_to_the_end_is_no_crash(tmp_path: Path) -> None:
    steps = [f"step {i}/20 loss 1.0" for i in range(1, 6)]
    report = replay(tmp_path, [*steps, *RANK1_CRASH, TORCHRUN_SUMMARY[0], *[f"step {i}/20 loss 1.0" for i in range(1, 21)]])
    assert report.failure is None and report.outcome is not Outcome.CRASHED


@pytest.mark.parametrize("late", [
    "step 6/20 loss 1.0",
    "Training:  30%|###       | 6/20 [00:06<00:14, 1.0it/s]",
    " [2025-01-01 00:00:06] iteration        6/      20 | consumed samples:           48 | lm loss: 1.0E+00 |",
])
def test_a_launchers_summary_after_another_ranks_late_step_still_echoes_the_crash_before_it(
        tmp_path: Path, late: str) -> None:
    before = [late.replace("6/", "5/").replace("6/      20", "5/      20"), *RANK1_CRASH, late, *TORCHRUN_SUMMARY]
    report = replay(tmp_path, before)
    assert report.outcome is Outcome.CRASHED and report.failure is not None
    assert report.failure.line.strip().endswith("RuntimeError: data shard 3: unexpected end of file"), report.failure
    facts = Facts(started_at=0.0)  # the watchdog names the same root cause
    for event in _events(before):
        facts.observe(event, 1.0)
    assert facts.primary_failure is not None and facts.primary_failure.line == report.failure.line


def test_a_step_line_glued_after_a_bar_redraw_leaves_the_record_to_the_bar(tmp_path: Path) -> None:
    report = replay(tmp_path, [f"train:  {p}%|##   | {d}/32 [00:00<00:00, 42.69it/s]step {d} loss 6.5" for p, d in
                               ((16, 5), (31, 10))])
    assert [(p.probe, p.done, p.total) for p in report.progress] == [("tqdm.training_bar", 10, 32)]
    assert [e.probe for e in _events(["train:  16%|##   | 5/32 [00:00<00:00, 42.69it/s]step 5 loss 6.5"])] == [
        "tqdm.training_bar", "training.step_after_bar"]


@pytest.mark.parametrize("signal", [15, 2, 1])
def test_a_launcher_that_got_a_termination_signal_was_ended_from_outside(tmp_path: Path, signal: int) -> None:
    report = replay(tmp_path, [
        "W1203 23:26:45.487000 7535 torch/distributed/run.py:874] Setting OMP_NUM_THREADS environment variable for "
        "each process to be 1 in default, to avoid your system being overloaded",
        "[rank 0] pipeline stage 0 of 2: 2112 parameters",
        f"W1203 23:31:43.186000 7535 torch/distributed/elastic/agent/server/api.py:753] Received {signal} death signal, "
        "shutting down workers",
        "W1203 23:31:43.187000 7535 torch/distributed/elastic/multiprocessing/api.py:1028] Sending process 7568 closing "
        "signal SIGTERM",
        "Traceback (most recent call last):", '  File "/usr/bin/torchrun", line 8, in <module>',
        f"torch.distributed.elastic.multiprocessing.api.SignalException: Process 7535 got signal: {signal}",
    ])
    assert report.outcome is Outcome.CRASHED and report.failure is not None
    assert report.failure.kind is FailureKind.KILLED and "death signal" in report.failure.line


def test_a_fatal_failure_is_never_one_the_program_survives_whatever_its_level() -> None:
    from supervisor.core.events import Failure
    assert Failure(FailureKind.OTHER, "x", level="WARNING").survivable
    assert not Failure(FailureKind.KILLED, "x", level="WARNING", fatal=True).survivable


def test_after_a_launcher_restarts_failed_workers_the_last_attempts_failure_explains_the_end(tmp_path: Path) -> None:
    again = ["[rank1]: Traceback (most recent call last):", '[rank1]:   File "train.py", line 2, in <module>',
             "[rank1]: RuntimeError: Gloo connectFullMesh failed with timed out connecting: Connection refused"]
    lines = [*RANK1_CRASH, *TORCHRUN_SUMMARY[:1], *again, *TORCHRUN_SUMMARY]
    report = replay(tmp_path, lines)
    assert report.failure is not None and "connectFullMesh" in report.failure.line, report.failure
    facts = Facts(started_at=0.0)
    for event in _events(lines):
        facts.observe(event, 1.0)
    assert facts.primary_failure is not None and facts.primary_failure.line == report.failure.line


def test_the_launchers_own_summary_after_its_failed_line_starts_no_new_attempt(tmp_path: Path) -> None:
    report = replay(tmp_path, [*RANK1_CRASH, *TORCHRUN_SUMMARY])
    assert report.failure is not None and report.failure.line.strip().endswith("unexpected end of file")


def test_a_trainers_step_lines_that_stop_are_a_stall_and_while_they_move_have_an_eta() -> None:
    from supervisor.core.events import Verdict
    from supervisor.spec.model import HealthSpec
    from supervisor.watchdog import Watchdog
    clock = [0.0]
    watchdog = Watchdog(HealthSpec(stall_floor_s=30), clock=lambda: clock[0])
    for i, event in enumerate(_events([f"step {n}/80 loss {2.0 - n / 100:.3f}" for n in range(1, 21)])):
        clock[0] = 5.0 * i  # a step every 5 s
        watchdog.observe(event)
    progress = watchdog.progress
    assert progress is not None and (progress.done, progress.total) == (20, 80)
    assert progress.eta_s == pytest.approx(300.0, rel=0.1)  # 60 steps to go at 5 s a step
    assert watchdog.check(clock[0] + 29).verdict is Verdict.HEALTHY
    assert watchdog.check(clock[0] + 31).verdict is Verdict.STALLED
