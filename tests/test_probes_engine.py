"""The probe engine: prefixes, ANSI, redraws, tracebacks, ordering and resuming."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from probe_helpers import events_of

from supervisor.core.events import FailureKind, Outcome, Phase, ProbeEvent, ProbeKind, Record
from supervisor.core.records import split_records
from supervisor.probes import ProbeEngine, load_packs
from supervisor.probes._replay import build_report

PACKS = load_packs()
CORPUS = Path(__file__).parent / "data" / "corpus"
HDR = "ERROR 04-19 16:21:20 [multiproc_executor.py:857] "


run = events_of  # every event of a whole text, flushed


def only(events: list[ProbeEvent], probe: str) -> list[ProbeEvent]:
    return [e for e in events if e.probe == probe]


def failures(events: list[ProbeEvent]) -> list[ProbeEvent]:
    return [e for e in events if e.kind is ProbeKind.FAILURE]


def traceback_lines(prefix: str, exc_line: str, frames: int = 2) -> list[str]:
    lines = [f"{prefix}Traceback (most recent call last):"]
    for i in range(frames):
        lines += [f'{prefix}  File "/srv/app/mod{i}.py", line {10 + i}, in f{i}', f"{prefix}    call_{i}()"]
    return [*lines, f"{prefix}{exc_line}"]


# ---- prefixes, ANSI, redraws ----------------------------------------------------------


def test_stacked_prefixes_become_fields() -> None:
    (event,) = run("(APIServer pid=1) (Worker_TP0 pid=7) INFO 04-19 16:21:20 [gpu_worker.py:1] "
                   "Available KV cache memory: 5.25 GiB\n")
    assert event.probe == "vllm.kv_memory"
    assert event.phase is Phase.KV_CACHE_PROFILE
    assert event.line.startswith("INFO 04-19")
    assert event.fields["proc"] == "Worker_TP0" and event.fields["pid"] == 7
    assert event.fields["gib"] == 5.25


@pytest.mark.parametrize(("line", "fields"), [
    ("vllm-1  | (EngineCore_DP0 pid=3) INFO 09-24 05:01:46 [default_loader.py:267] Loading weights took 2.40 seconds",
     {"service": "vllm-1", "proc": "EngineCore_DP0", "pid": 3}),
    ("  | (EngineCore_DP0 pid=5253) INFO 09-24 05:01:46 [default_loader.py:267] Loading weights took 2.40 seconds",
     {"proc": "EngineCore_DP0", "pid": 5253}),
    ("Dec 18 20:16:22 gpu-box python3[1234]: (VllmWorker rank=3 pid=99) INFO 12-18 20:16:22 [loader.py:1] "
     "Loading weights took 2.40 seconds", {"host": "gpu-box", "proc": "VllmWorker", "rank": 3, "pid": 99}),
    ("\x1b[1;36m(VllmWorker TP3 pid=9)\x1b[0;0m INFO 12-18 20:16:22 [loader.py:1] Loading weights took 2.40 seconds",
     {"proc": "VllmWorker", "rank": 3, "pid": 9}),
    ("[1;36m(VllmWorkerProcess pid=5)[0;0m INFO 12-18 20:16:22 loader.py:1] Loading weights took 2.40 seconds",
     {"proc": "VllmWorkerProcess", "pid": 5}),
])
def test_prefix_forms(line: str, fields: dict[str, object]) -> None:
    (event,) = run(line + "\n")
    assert event.probe == "vllm.weights_loaded"
    assert event.fields["secs"] == 2.40
    assert {k: event.fields[k] for k in fields} == fields
    assert event.line.endswith("Loading weights took 2.40 seconds")
    assert "\x1b" not in event.line and "[1;36m" not in event.line


def test_ansi_codes_anywhere_are_removed() -> None:
    (event,) = run("\x1b[32mINFO\x1b[0m:     \x1b[1mApplication startup complete.\x1b[0m\x1b[A\n")
    assert event.probe == "uvicorn.startup_complete"
    assert event.line == "INFO:     Application startup complete."


def test_carriage_return_redraws_are_progress() -> None:
    data = ("Loading weights:   0%|          | 0/4 [00:00<?, ?it/s]"
            "\rLoading weights:  50%|█████     | 2/4 [00:01<00:01,  2.00it/s]"
            "\rLoading weights: 100%|██████████| 4/4 [00:02<00:00,  1.25s/it]\n").encode()
    records, _ = split_records(data, 0, final=True)
    assert [r.redraw for r in records] == [True, True, False]
    events = run(data)
    assert [(e.fields["done"], e.fields["total"]) for e in events] == [(0, 4), (2, 4), (4, 4)]
    assert all(e.probe == "transformers.loading_weights" and e.phase is Phase.WEIGHT_LOADING for e in events)
    assert "rate" not in events[0].fields  # "?it/s"
    assert events[1].fields["rate"] == 2.0 and events[2].fields["rate"] == pytest.approx(0.8)
    assert events[1].fields["elapsed"] == 1.0 and events[1].fields["remaining"] == 1.0
    assert [e.offset for e in events] == [r.offset for r in records]


def test_vllm_shard_bar_after_a_bare_prefix() -> None:
    # 0.11-0.17 write "(Worker_TP0 pid=N) " then "\rLoading...\n": a prefix-only record first.
    data = b"".join(
        b"(Worker_TP0 pid=79) \rLoading safetensors checkpoint shards:  %d%% Completed | %d/48 "
        b"[00:0%d<02:26,  3.12s/it]\n" % (k * 2, k, k) for k in range(1, 4)
    )
    events = run(data)
    assert [e.fields["done"] for e in events] == [1, 2, 3]
    assert all(e.probe == "vllm.shards" and e.fields["total"] == 48 for e in events)
    assert all(e.fields["proc"] == "Worker_TP0" and e.fields["pid"] == 79 for e in events)
    assert events[0].fields["rate"] == pytest.approx(1 / 3.12)


def test_shard_bar_on_its_own_line_after_a_prefix_line() -> None:
    events = run("[1;36m(VllmWorker rank=0 pid=226) \n"
                 "Loading safetensors checkpoint shards:  19% Completed | 7/37 [00:01<00:07,  4.00it/s]\n")
    (event,) = events
    assert event.fields["proc"] == "VllmWorker" and event.fields["done"] == 7


def test_first_matching_probe_wins() -> None:
    (event,) = run("Loading checkpoint shards:  33%|███▎      | 1/3 [00:00<00:01,  1.23it/s]\n")
    assert event.probe == "transformers.checkpoint_shards"  # not the generic tqdm.bar
    (event,) = run("Parse safetensors files: 100%|██████████| 4/4 [00:00<00:00, 15.83it/s]\n")
    assert event.probe == "tqdm.bar" and event.fields["desc"] == "Parse safetensors files"
    assert event.phase is None


def test_heartbeats_are_info_not_progress_nor_failure() -> None:
    events = run(
        "(EngineCore pid=127) INFO 04-15 13:42:25 [shm_broadcast.py:681] No available shared memory broadcast "
        "block found in 60 seconds. This typically happens when some processes are hanging.\n"
        "DEBUG 04-17 08:12:24 [core_client.py:421] Waiting for 1 core engine proc(s) to start: {0}\n"
        "DEBUG 04-17 08:12:24 [client.py:1] Waiting for output from MQLLMEngine.\n"
    )
    assert [e.probe for e in events] == ["vllm.shm_wait", "vllm.core_wait", "vllm.mq_wait"]
    assert all(e.kind is ProbeKind.INFO and e.fields["heartbeat"] is True and e.phase is None for e in events)
    assert events[0].fields["secs"] == 60


@pytest.mark.parametrize(("line", "probe", "fields"), [
    ("extract progress: 12/200 samples, 5321.4 tok/s", "extract.samples", {"done": 12, "total": 200, "tok_s": 5321.4}),
    ("extract: sample 12/200 tok/s=5321.4", "extract.sample", {"done": 12, "total": 200, "tok_s": 5321.4}),
    ("extract done: 200 samples, 123456 tokens in 42.5s", "extract.done", {"samples": 200, "tokens": 123456}),
    ("train step 5/100 loss=2.3456 acc0=0.512 tok/s=1234.5", "train.steps",
     {"done": 5, "total": 100, "loss": 2.3456, "acc": 0.512, "tok_s": 1234.5}),
    ("train checkpoint saved: step 50 path /tmp/run/ckpt-50", "train.checkpoint",
     {"step": 50, "path": "/tmp/run/ckpt-50"}),
    ("train done: 100 steps", "train.done", {"steps": 100}),
    ("train loss is not finite at step 17", "train.not_finite", {"step": 17}),
])
def test_job_program_lines(line: str, probe: str, fields: dict[str, object]) -> None:
    (event,) = run(line + "\n")
    assert event.probe == probe
    assert {k: event.fields[k] for k in fields} == fields


def test_job_done_lines_make_the_replay_done() -> None:
    steps = "".join(f"train step {k}/3 loss=1.{k}000 acc0=0.100 tok/s=10.0\n" for k in range(1, 4))
    report = build_report(run(steps + "train done: 3 steps\n"))
    assert (report.outcome, report.last_phase) == (Outcome.DONE, Phase.DONE)
    report = build_report(run(steps + "train loss is not finite at step 3\n"))
    assert report.outcome is Outcome.CRASHED and report.failure is not None


def test_broken_bytes_nul_and_cut_lines_are_tolerated() -> None:
    events = run(b"\x00\xff\xfeLoading weights took 1.50 seconds\n" + b"x" * 3_000_000 + b"\n")
    (event,) = events
    assert event.fields["secs"] == 1.5


def test_records_with_their_own_newline_still_work() -> None:
    engine = ProbeEngine(PACKS)
    record = Record("noise\nLoading weights took 1.50 seconds", 0, 40)
    (event,) = engine.feed_many([record, Record("Loading weights took 2.50 seconds", 40, 74)])[:1]
    assert event.probe == "vllm.weights_loaded"


# ---- tracebacks -----------------------------------------------------------------------


def test_logger_exception_traceback_with_a_prefix_on_every_line() -> None:
    prefix = f"(Worker_TP0 pid=259104) {HDR}"
    lines = [f"{prefix}WorkerProc failed to start.",
             *traceback_lines(prefix, "KeyError: 'layers.0.mlp.experts.w2_weight'")]
    events = run("\n".join(lines) + "\n(APIServer pid=1) INFO 04-19 16:21:21 [launcher.py:1] shutting down\n")
    first, tb = failures(events)
    assert first.probe == "vllm.worker_failed" and first.failure.kind is FailureKind.OTHER
    assert tb.probe == "python.traceback"
    assert tb.failure is not None and tb.failure.kind is FailureKind.KEY_ERROR
    assert tb.line == "KeyError: 'layers.0.mlp.experts.w2_weight'"
    assert tb.fields["proc"] == "Worker_TP0" and tb.failure.level == "ERROR"
    assert tb.failure.traceback is not None
    assert tb.failure.traceback.splitlines()[0] == "Traceback (most recent call last):"
    assert tb.failure.traceback.splitlines()[-1] == "KeyError: 'layers.0.mlp.experts.w2_weight'"
    assert "ERROR 04-19" not in tb.failure.traceback and len(tb.failure.traceback.splitlines()) == 6
    assert tb.offset == len(lines[0]) + 1  # where "Traceback" starts
    assert tb.failure.fingerprint


def test_traceback_with_torch_rank_prefix_and_message_continuation() -> None:
    lines = traceback_lines("[rank0]: ", "RuntimeError: CUDA error: out of memory")
    lines += ["[rank0]: CUDA kernel errors might be asynchronously reported at some other API call.",
              "[rank0]: For debugging consider passing CUDA_LAUNCH_BLOCKING=1"]
    (tb,) = failures(run("\n".join(lines) + "\n"))
    assert tb.failure is not None and tb.failure.kind is FailureKind.CUDA_OOM
    assert tb.line == "RuntimeError: CUDA error: out of memory"
    assert tb.fields["rank"] == 0
    assert tb.failure.traceback is not None and tb.failure.traceback.endswith("CUDA_LAUNCH_BLOCKING=1")


def test_interleaved_ranks_do_not_merge() -> None:
    a = traceback_lines("[rank0]: ", "KeyError: 'alpha'", frames=3)
    b = traceback_lines("[rank1]: ", "ValueError: beta is wrong", frames=3)
    mixed = [line for pair in zip(a, b, strict=True) for line in pair]
    tbs = failures(run("\n".join(mixed) + "\n"))
    assert [(e.fields["rank"], e.failure and e.failure.kind) for e in tbs] == [(0, FailureKind.KEY_ERROR), (1, FailureKind.VALUE_ERROR)]
    for event, own in zip(tbs, (a, b), strict=True):
        assert event.failure is not None and event.failure.traceback == "\n".join(line.split(": ", 1)[1] for line in own)


def test_interleaved_vllm_workers_do_not_merge() -> None:
    a = traceback_lines(f"(Worker_TP0 pid=10) {HDR}", "AssertionError: shapes differ")
    b = traceback_lines(f"(Worker_TP1 pid=11) {HDR}",
                        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    mixed = [line for pair in zip(a, b, strict=True) for line in pair]
    tbs = failures(run("\n".join(mixed) + "\n"))
    assert [(e.fields["proc"], e.failure and e.failure.kind) for e in tbs] == [
        ("Worker_TP0", FailureKind.ASSERTION), ("Worker_TP1", FailureKind.CUDA_OOM)]


def test_interleaved_line_from_another_stream_does_not_end_a_traceback() -> None:
    prefix = f"(EngineCore_DP0 pid=494) {HDR}"
    lines = traceback_lines(prefix, "ValueError: no memory for the KV cache", frames=3)
    lines.insert(3, "(EngineCore_DP0 pid=494) Process EngineCore_DP0:")
    (tb,) = failures(run("\n".join(lines) + "\n"))
    assert tb.failure is not None and tb.failure.kind is FailureKind.VALUE_ERROR
    assert len(tb.failure.traceback.splitlines()) == 8  # type: ignore[union-attr]


def test_chained_traceback_reports_the_informative_exception() -> None:
    chain = [*traceback_lines("", "NotImplementedError: no kernel for lora_expand"), "",
             "During handling of the above exception, another exception occurred:", "",
             *traceback_lines("", "RuntimeError: Expected size [8192, 16] but got [8192, 4608]")]
    (tb,) = failures(run("\n".join(chain) + "\n"))
    assert tb.failure is not None and tb.failure.kind is FailureKind.RUNTIME_ERROR
    assert tb.line.startswith("RuntimeError: Expected size")
    assert tb.fields["chained"] == 2


def test_chained_traceback_prefers_the_root_cause_oom() -> None:
    chain = [*traceback_lines("", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB"),
             "The above exception was the direct cause of the following exception:",
             *traceback_lines("", "RuntimeError: Worker failed with error 'see above'")]
    (tb,) = failures(run("\n".join(chain) + "\n"))
    assert tb.failure is not None and tb.failure.kind is FailureKind.CUDA_OOM and tb.line.startswith("torch.OutOfMemoryError")


def test_chained_traceback_skips_a_final_see_root_cause_line() -> None:
    chain = [*traceback_lines("", "KeyError: 'lm_head.weight'"),
             "The above exception was the direct cause of the following exception:",
             *traceback_lines("", "RuntimeError: Engine core initialization failed. See root cause above.")]
    (tb,) = failures(run("\n".join(chain) + "\n"))
    assert tb.failure is not None and tb.failure.kind is FailureKind.KEY_ERROR


@pytest.mark.parametrize(("exc_line", "kind"), [
    ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 16.00 GiB.", FailureKind.CUDA_OOM),
    ("torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 79.10 GiB total capacity)",
     FailureKind.CUDA_OOM),
    ("RuntimeError: CUDA error: out of memory", FailureKind.CUDA_OOM),
    ("RuntimeError: NCCL error: unhandled system error (run with NCCL_DEBUG=INFO for details)", FailureKind.NCCL),
    ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, internal error", FailureKind.NCCL),
    ("torch.distributed.DistBackendError: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)",
     FailureKind.DISTRIBUTED_TIMEOUT),
    ("AssertionError", FailureKind.ASSERTION),
    ("ImportError: cannot import name 'x' from 'y'", FailureKind.IMPORT_ERROR),
    ("ModuleNotFoundError: No module named 'flash_attn'", FailureKind.IMPORT_ERROR),
    ("ValueError: Free memory on device cuda:0 (28.77/139.8 GiB) on startup is less than desired",
     FailureKind.VALUE_ERROR),
    ("KeyError: 'layers.0.mlp.down_proj.weight_scale'", FailureKind.KEY_ERROR),
    ("TypeError: forward() got an unexpected keyword argument 'x'", FailureKind.TYPE_ERROR),
    ("AttributeError: 'NoneType' object has no attribute 'shape'", FailureKind.ATTRIBUTE_ERROR),
    ("NotImplementedError: Could not run 'vllm::lora_expand' with arguments from the 'CUDA' backend.",
     FailureKind.NOT_IMPLEMENTED),
    ("RuntimeError: The expanded size of the tensor (4) must match the existing size (3)", FailureKind.RUNTIME_ERROR),
    ("FileNotFoundError: [Errno 2] No such file or directory: 'x'", FailureKind.OTHER),
])
def test_traceback_kinds(exc_line: str, kind: FailureKind) -> None:
    (tb,) = failures(run("\n".join(traceback_lines("", exc_line)) + "\n"))
    assert tb.failure is not None and tb.failure.kind is kind
    assert tb.line == exc_line


def test_headless_traceback_from_an_excerpt() -> None:
    prefix = "ERROR 12-05 20:24:46 engine.py:366] "
    lines = [f'{prefix}  File "/x/utils.py", line 229, in load_weights', f"{prefix}    param = params[name]",
             f"{prefix}KeyError: 'layers.0.weight_scale'"]
    (tb,) = failures(run("\n".join(lines) + "\n"))
    # The frame says it crashed loading weights: a KeyError there is a start-up error.
    assert tb.failure is not None and tb.failure.kind is FailureKind.CONFIG_ERROR and tb.offset == 0
    assert tb.phase is Phase.WEIGHT_LOADING


def test_truncated_traceback_is_reported_at_flush() -> None:
    data = ("(VllmWorkerProcess pid=232) ERROR 08-23 08:25:25 multiproc_worker_utils.py:226] Exception in worker "
            "VllmWorkerProcess while processing method init_device: NCCL error: unhandled system error, "
            "Traceback (most recent call last):\n"
            "(VllmWorkerProcess pid=232) ERROR 08-23 08:25:25 multiproc_worker_utils.py:226]"
            '   File "/w.py", line 1, in f\n')
    records, _ = split_records(data.encode(), 0, final=True)
    engine = ProbeEngine(PACKS)
    assert engine.feed_many(records) == []  # still open: the exception line may come
    (tb,) = engine.flush()
    assert tb.failure is not None and tb.failure.kind is FailureKind.NCCL  # from the text before "Traceback"
    assert "Exception in worker" in tb.line


def test_warning_traceback_before_ready_is_not_a_crash() -> None:
    prefix = "(APIServer pid=678) WARNING 11-29 15:07:24 [base.py:249] "
    warm = [f"{prefix}Chat template warmup failed",
            *traceback_lines(prefix, "ValueError: Tokenizer not available when `skip_tokenizer_init=True`")]
    ready = "(APIServer pid=678) INFO:     Application startup complete."
    events = run("\n".join(warm) + "\n" + ready + "\n")
    (tb,) = failures(events)
    assert tb.failure is not None and tb.failure.level == "WARNING"
    report = build_report(events)
    assert (report.outcome, report.failure) == (Outcome.READY, None)
    # Without readiness afterwards, it is the failure.
    assert build_report(run("\n".join(warm) + "\n")).outcome is Outcome.CRASHED
    # At ERROR level, it is the failure unless the program goes on: readiness afterwards is going on
    # (the live watchdog counts it a recovery at exit 0 too: one rule, probes/_phasefold).
    errors = "\n".join(line.replace("WARNING", "ERROR") for line in warm)
    assert build_report(run(errors + "\n")).outcome is Outcome.CRASHED
    assert build_report(run(errors + "\n" + ready + "\n")).outcome is Outcome.READY


def test_line_failures_carry_the_log_level() -> None:
    (event,) = run("[rank0]:[E1218 20:27:21.426415540 ProcessGroupNCCL.cpp:629] [Rank 0] Watchdog caught collective "
                   "operation timeout: WorkNCCL(SeqNum=1, OpType=BROADCAST, NumelIn=131072000, NumelOut=131072000, "
                   "Timeout(ms)=600000) ran for 600081 milliseconds before timing out.\n")
    assert event.failure is not None and event.failure.kind is FailureKind.DISTRIBUTED_TIMEOUT
    assert event.failure.level == "ERROR" and event.fields["rank"] == 0
    assert (event.fields["op"], event.fields["timeout_ms"]) == ("BROADCAST", 600000)


# ---- evil user patterns ---------------------------------------------------------------


def test_catastrophic_user_pattern_returns_promptly(tmp_path: Path) -> None:
    pack = tmp_path / "evil.toml"
    pack.write_text("name = 'evil'\n[[probes]]\nid = 'nested'\nkind = 'info'\nregex = '(a+)+$'\n")
    engine = ProbeEngine(load_packs([], [pack]))
    line = "a" * 100_000 + "!"
    start = time.monotonic()
    events = engine.feed_many([Record(line, 0, len(line) + 1), Record("a" * 100_000, len(line) + 1, 200_003)])
    assert time.monotonic() - start < 1.0
    assert [e.offset for e in events] == [len(line) + 1]


# ---- ordering, batching and resuming --------------------------------------------------


def _corpus(*names: str) -> list[Path]:
    return [next(CORPUS.rglob(name)) for name in names]


def _interleaved_log() -> bytes:
    a = traceback_lines("[rank0]: ", "KeyError: 'alpha'", frames=4)
    b = traceback_lines("[rank1]: ", "ValueError: beta", frames=4)
    lines = ["Step    0 | Loss: 11.0838 | Time: 1.6s"]
    for x, y in zip(a, b, strict=True):
        lines += [x, "Loading checkpoint shards:  33%|███▎      | 1/3 [00:00<00:01,  1.23it/s]", y]
    lines += ["(Worker_TP0 pid=1) ",
              "Loading safetensors checkpoint shards:  50% Completed | 1/2 [00:01<00:01,  1.2s/it]",
              "Application startup complete."]
    return ("\n".join(lines) + "\n").encode()


RESUME_LOGS = [
    *_corpus("03-unsloth-vllm-rocm-lora-profile-crash.log", "02-deepspeed-zero3-gpt2-train-oom.log",
             "19-enginecore-failed-after-kv-mem.log", "01-vllm-0.13-ready-13shards.log",
             "06-accelerate-deepspeed-sigkill.log", "vllm-0.23-6.7b-serve-stall-at-5of13.log"),
    "interleaved",
]


def _key(events: list[ProbeEvent]) -> list[tuple[str, int, str]]:
    return [(e.probe, e.offset, e.line) for e in events]


@pytest.mark.parametrize("log", RESUME_LOGS, ids=lambda p: p if isinstance(p, str) else p.name)
def test_resume_offset_loses_and_doubles_nothing(log: Path | str) -> None:
    data = _interleaved_log() if log == "interleaved" else Path(log).read_bytes()
    records, _ = split_records(data, 0, final=True)
    whole = ProbeEngine(PACKS)
    expected = _key(whole.feed_many(records) + whole.flush())
    cuts = sorted({*range(0, len(records), max(1, len(records) // 40)), len(records)})
    for cut in cuts:
        first = ProbeEngine(PACKS)
        events = [e for record in records[:cut] for e in first.feed(record)]  # as the runner feeds
        resume = first.resume_offset
        assert resume <= (records[cut - 1].end if cut else 0)
        second = ProbeEngine(PACKS, start_offset=resume)
        assert second.resume_offset == resume
        rest, _ = split_records(data[resume:], resume, final=True)
        events += second.feed_many(rest) + second.flush()
        assert _key(events) == expected, f"cut after record {cut} (resume at {resume})"


def test_resume_offset_points_at_an_open_traceback() -> None:
    lines = ["INFO 01-01 00:00:00 [a.py:1] Loading weights took 1.00 seconds", *traceback_lines("", "KeyError: 'x'")]
    data = ("\n".join(lines) + "\n").encode()
    records, _ = split_records(data, 0, final=True)
    engine = ProbeEngine(PACKS)
    assert engine.resume_offset == 0
    (loaded,) = engine.feed_many(records[:3])
    assert loaded.probe == "vllm.weights_loaded"
    assert engine.resume_offset == records[1].offset  # the "Traceback" line
    assert engine.feed_many(records[3:]) == []  # the exception line may continue
    assert engine.resume_offset == records[1].offset
    (tb,) = engine.flush()
    assert tb.failure is not None and tb.failure.kind is FailureKind.CONFIG_ERROR  # raised while starting up
    assert engine.resume_offset == len(data)


@pytest.mark.parametrize("path", sorted(CORPUS.rglob("*.log")), ids=lambda p: p.name)
def test_feed_and_feed_many_agree_and_keep_offset_order(path: Path) -> None:
    records, _ = split_records(path.read_bytes(), 0, final=True)
    one = ProbeEngine(PACKS)
    by_record = [e for r in records for e in one.feed(r)] + one.flush()
    many = ProbeEngine(PACKS)
    by_batch = [e for i in range(0, len(records), 37) for e in many.feed_many(records[i:i + 37])] + many.flush()
    assert [(e.probe, e.offset, e.line, e.fields) for e in by_record] == \
           [(e.probe, e.offset, e.line, e.fields) for e in by_batch]
    offsets = [e.offset for e in by_record]
    assert offsets == sorted(offsets)


@pytest.mark.parametrize("path", sorted(CORPUS.rglob("*.log")), ids=lambda p: p.name)
def test_prefilter_loses_no_event(path: Path) -> None:
    records, _ = split_records(path.read_bytes(), 0, final=True)
    fast = ProbeEngine(PACKS)
    slow = ProbeEngine(PACKS)
    slow._always = True  # read every record: what the literal prefilter may skip must not matter
    assert _key(fast.feed_many(records) + fast.flush()) == _key(slow.feed_many(records) + slow.flush())


def test_an_endless_traceback_look_alike_is_given_up() -> None:
    # A program printing "Traceback ..." in its own output, then indented lines forever,
    # must not hold every later event back without bound.
    lines = ["Traceback (most recent call last):", *(f"    item {k}" for k in range(2500)),
             "Loading weights took 1.00 seconds"]
    records, _ = split_records(("\n".join(lines) + "\n").encode(), 0, final=True)
    engine = ProbeEngine(PACKS)
    events = engine.feed_many(records)
    assert [e.probe for e in events] == ["python.traceback", "vllm.weights_loaded"]
    assert len(events[0].failure.traceback.splitlines()) == 2000  # type: ignore[union-attr]


def test_extract_job_log_end_to_end() -> None:
    log = ("extract phase: model_init\n"
           "(EngineCore pid=3) \rLoading safetensors checkpoint shards: 100% Completed | 2/2 [00:00<00:00, 99.3it/s]\n"
           "extract phase: extracting\n"
           "extract progress: 2/4 samples, 812.5 tok/s\n"
           "extract progress: 4/4 samples, 901.0 tok/s\n"
           "extract done: 4 samples, 1401 tokens in 1.6s\n")
    report = build_report(run(log))
    assert (report.outcome, report.last_phase) == (Outcome.DONE, Phase.DONE)
    assert [(p.probe, p.done, p.total) for p in report.progress] == [("vllm.shards", 2, 2), ("extract.samples", 4, 4)]
    short = build_report(run(log + "extract incomplete: 1 of 4 samples failed (3); relaunch to retry them\n"))
    assert short.outcome is Outcome.CRASHED and short.failure is not None
    assert short.failure.line.startswith("extract incomplete")


def test_a_bar_with_the_next_log_line_glued_on_still_advances() -> None:
    # From a real LLaMA-Factory run: tqdm's last redraw, then the trainer's log line written
    # straight after it with no newline.  Both the bar and the log line are read.
    from supervisor.core.events import ProbeKind, Record
    from supervisor.probes import ProbeEngine, load_packs

    text = ("100%|██████████| 72/72 [33:13<00:00, 22.84s/it][INFO|trainer.py:4309] 2026-04-22 01:29:39,056 >> "
            "Saving model checkpoint to /out/checkpoint-72")
    engine = ProbeEngine(load_packs())
    events = engine.feed(Record(text=text, offset=0, end=len(text.encode()) + 1, redraw=False))
    kinds = [e.kind for e in events]
    assert kinds[0] is ProbeKind.PROGRESS and events[0].fields["done"] == 72
    assert len(events) == 2 and events[1].kind is not ProbeKind.PROGRESS
