"""General rules for logs nobody here has seen (issue: probes on unseen logs, round 2): each is a
rule about a kind of line, whatever the program, checked on lines that must match and on
near-misses that must not.  The real logs that show each are in tests/data/corpus/wave3-logs/."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.events import FailureKind, Outcome, Phase
from supervisor.probes import replay_file


def replay(tmp_path: Path, lines: list[str]):  # noqa: ANN201 - a ReplayReport
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
