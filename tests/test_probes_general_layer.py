"""The general layer (probes/general.toml, and the engine's rules for a chain's root cause and the phase of a
failure before any phase): each rule read on real logs of at least two different programs, or, where the
corpus holds one, a line quoted from another real log with its source; and near-misses that must not match.

Logs: tests/data/corpus/ (wave5-logs/ are the runs of tests/data/wave5-sources/run_all.sh on an H100; the
others are earlier waves').  None of tests/data/heldout-logs/ is read here."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.core.events import FailureKind, Outcome, Phase
from supervisor.probes import ReplayReport, load_packs, replay_file

CORPUS = Path(__file__).parent / "data" / "corpus"
W5 = CORPUS / "wave5-logs"


def replay(path: Path) -> ReplayReport:
    return replay_file(path)


def replay_lines(tmp_path: Path, lines: list[str]) -> ReplayReport:
    log = tmp_path / "job.log"
    log.write_text("".join(line + "\n" for line in lines))
    return replay_file(log)


def probes_of(report: ReplayReport) -> set[str]:
    return {e.probe for e in report.events}


def test_the_general_pack_is_there_and_read_last() -> None:
    packs = {p.name: p for p in load_packs()}
    # After every other pack: a framework's reading of a line (and tqdm's of a bar: `Epoch 3/10: 0%|...| 33/15625`)
    # wins over the general one.
    assert max(p.priority for n, p in packs.items() if n != "general") < packs["general"].priority


# ---- progress: a counter at a line's start makes the program running ------------------------------------


@pytest.mark.parametrize("path", [
    W5 / "torch-loop-sigterm-iter.log",  # `iter 40/2000 | loss 2.3104 | 02:54:35` (a torch loop)
    W5 / "cupy-fft-oom.log",  # `round 6/39: allocating 24.0 GiB` (CuPy)
    W5 / "cuda-cpp-illegal-address.log",  # `iter 2/5 ok` (CUDA C++)
    CORPUS / "wave4-logs/06-torchrun-pipelining-gpipe-2-stages-done.log",  # an earlier wave's trainer
], ids=lambda p: p.name)
def test_a_programs_own_counter_is_progress_of_the_running_phase(path: Path) -> None:
    report = replay(path)
    assert report.last_phase in (Phase.RUNNING, Phase.DONE), report.last_phase
    assert any(p.probe in ("general.counter", "training.step") for p in report.progress), report.progress


@pytest.mark.parametrize("line", [
    "model has 12 layers, 4/8 heads sharded",  # a ratio mid-line, not a count of the program's work
    "GPU util 95% 3/4 devices busy",
])
def test_a_ratio_that_is_not_a_programs_count_is_not_progress(tmp_path: Path, line: str) -> None:
    report = replay_lines(tmp_path, [line])
    assert "general.counter" not in probes_of(report) and report.last_phase is None


def test_a_tqdm_bar_without_its_separators_is_a_bar(tmp_path: Path) -> None:
    # One source: the line as issue 51 quotes it from an unseen log (Colab's rendering of transformers'
    # shard bar); no log in reach shows this rendering otherwise.
    report = replay_lines(tmp_path, ["Loading checkpoint shards: 100% 2/2 [00:03<00:00,  1.52s/it]"])
    assert [(p.done, p.total) for p in report.progress] == [(2, 2)], report.progress


# ---- the end of a run --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", [
    W5 / "torch-loop-done-complete-marker.log",  # `=== Training Complete ===` (a torch loop)
    W5 / "torchrun-1proc-done.log",  # the same sentence under torchrun, after its launcher's lines
    W5 / "accelerate-launch-done.log",  # `Saved model to /tmp/acc_model.pt` (accelerate launch)
], ids=lambda p: p.name)
def test_a_programs_closing_sentence_is_done(path: Path) -> None:
    report = replay(path)
    assert report.outcome is Outcome.DONE and report.last_phase is Phase.DONE, (report.outcome, report.last_phase)
    assert probes_of(report) & {"general.completed", "general.saved_model"}


@pytest.mark.parametrize("line", [
    "Training complete!",  # issue 51's unseen custom trainer
    "=== Training Complete ===",
    "Training finished.",
    "main: cleaning up before exit",  # llama.cpp's tools (llama-cli, llama-server), as issue 51 quotes them
    "0.02.001.000 I main: cleaning up before exit",  # the same with llama.cpp's timestamp and level
])
def test_closing_sentences_any_program_prints(tmp_path: Path, line: str) -> None:
    assert replay_lines(tmp_path, ["starting", line]).last_phase is Phase.DONE


def test_a_checkpoint_saved_mid_run_is_not_the_end() -> None:
    # verl saves `[Rank 3] Saved model to .../global_step_20/actor/...` at every checkpoint of a run that goes on.
    report = replay(CORPUS / "wave3-logs/18-verl-grpo-running-33-of-15625.log")
    assert report.last_phase is not Phase.DONE and "general.saved_model" not in probes_of(report)


@pytest.mark.parametrize("line", ["Training completed in 3 epochs, starting evaluation", "run complete_step 3"])
def test_words_of_completion_inside_a_longer_line_are_not_the_end(tmp_path: Path, line: str) -> None:
    assert replay_lines(tmp_path, [line]).last_phase is not Phase.DONE


# ---- one-line failures of Python and the shell ---------------------------------------------------------------


@pytest.mark.parametrize("path, kind, line", [
    (W5 / "shell-python-nonexistent-script.log", FailureKind.COMMAND_NOT_FOUND, "can't open file"),
    (W5 / "shell-python-m-missing-package-submodule.log", FailureKind.IMPORT_ERROR,
     "Error while finding module specification for 'axolotl.cli.train'"),
    (W5 / "shell-cd-missing-dir.log", FailureKind.CONFIG_ERROR, "cd: /data/run7: No such file or directory"),
    (W5 / "torch-config-systemexit.log", FailureKind.OTHER, "error: config has no 'dataset' entry"),
], ids=lambda v: v.name if isinstance(v, Path) else str(v)[:20])
def test_a_one_line_refusal_is_a_failure_at_start_up(path: Path, kind: FailureKind, line: str) -> None:
    report = replay(path)
    assert report.outcome is Outcome.CRASHED and report.failure is not None
    assert report.failure.kind is kind and line in report.failure.line, report.failure
    assert report.last_phase is Phase.STARTUP


@pytest.mark.parametrize("line, kind", [
    # Another Python's words for the same refusals (issue 51's unseen logs; /usr/bin/python3's prefix).
    ("/usr/bin/python3: can't open file '/home/u/nonexistent.py': [Errno 2] No such file or directory",
     FailureKind.COMMAND_NOT_FOUND),
    ("/usr/bin/python3: Error while finding module specification for 'lm_eval.__main__' "
     "(ModuleNotFoundError: No module named 'lm_eval')", FailureKind.IMPORT_ERROR),
    ("/usr/bin/python3: No module named vllm", FailureKind.IMPORT_ERROR),
    # dash's wording, from the corpus's DeepSpeed log (full-logs/02-...): `/bin/sh: 1: c++: not found`.
    ("/bin/sh: 1: c++: not found", FailureKind.COMMAND_NOT_FOUND),
    ("bash: line 1: tune: command not found", FailureKind.COMMAND_NOT_FOUND),
    ("fatal: not a git repository (or any of the parent directories): .git", FailureKind.OTHER),
])
def test_one_line_refusals_in_other_words(tmp_path: Path, line: str, kind: FailureKind) -> None:
    report = replay_lines(tmp_path, [line])
    assert report.failure is not None and report.failure.kind is kind, report.failure
    assert report.last_phase is Phase.STARTUP


@pytest.mark.parametrize("line", [
    "INFO: no error: argument parsing went fine",
    "loss error: 0.31 at step 5",
    "warning: python3: can't open file cache, rebuilding",
])
def test_lines_that_only_mention_errors_are_not_failures(tmp_path: Path, line: str) -> None:
    assert replay_lines(tmp_path, [line]).failure is None


# ---- signals and native crashes ------------------------------------------------------------------------------


@pytest.mark.parametrize("path, line", [
    (W5 / "torch-loop-sigterm-iter.log", "Terminated"),  # bash's report of its child's SIGTERM
    (W5 / "torch-loop-sigkill-percent.log", "Killed"),  # and of a SIGKILL (python.toml's rule)
    # torchrun asked to stop: `Received 15 death signal, shutting down workers` (an earlier wave's log).
    (CORPUS / "wave4-logs/05-torchrun-pipelining-gpipe-shape-inference-hang-sigterm.log", "death signal"),
], ids=lambda v: v.name if isinstance(v, Path) else v)
def test_a_stop_from_outside_is_killed(path: Path, line: str) -> None:
    report = replay(path)
    assert report.failure is not None and report.failure.kind is FailureKind.KILLED, report.failure
    assert line in report.failure.line


@pytest.mark.parametrize("line", [
    "Main process received SIGINT, exiting",  # issue 51's unseen launcher
    "W1207 02:55:11.447000 2306 torch/distributed/elastic/agent/server/api.py:739] Received 2 death signal, "
    "shutting down workers",  # torchrun 2.11 on Ctrl-C
    "bash: line 1:  2274 Terminated              python3 train.py",
])
def test_stop_signals_in_other_words(tmp_path: Path, line: str) -> None:
    report = replay_lines(tmp_path, ["step 1/10", line])
    assert report.failure is not None and report.failure.kind is FailureKind.KILLED, report.failure


@pytest.mark.parametrize("line", [
    "bash: line 1:  6979 Aborted                 ./cpp_job missing",  # a C++ job's uncaught exception (SIGABRT)
    "Aborted (core dumped)",
    "Segmentation fault (core dumped)",  # llama.cpp's server, github.com/ggml-org/llama.cpp/issues/24824
    "run.sh: line 12: 31337 Segmentation fault      (core dumped) ./llama-server -m model.gguf",
    "Bus error (core dumped)",
])
def test_the_shells_report_of_a_native_crash_is_a_failure(tmp_path: Path, line: str) -> None:
    report = replay_lines(tmp_path, ["iter 1/5 ok", line])
    assert report.outcome is Outcome.CRASHED and report.failure is not None and report.failure.line == line


@pytest.mark.parametrize("path, kind, outcome", [
    (W5 / "cuda-cpp-malloc-oom.log", FailureKind.CUDA_OOM, Outcome.OOM),  # `CUDA error: out of memory at ...:35`
    (W5 / "cuda-cpp-illegal-address.log", FailureKind.RUNTIME_ERROR, Outcome.CRASHED),
], ids=lambda v: v.name if isinstance(v, Path) else str(v))
def test_a_cuda_error_at_file_and_line_is_read_with_its_kind(path: Path, kind: FailureKind, outcome: Outcome) -> None:
    report = replay(path)
    assert report.outcome is outcome and report.failure is not None and report.failure.kind is kind
    assert " at cudaprog.cu:" in report.failure.line


@pytest.mark.parametrize("line, kind", [
    # The same macro's words on a machine without a GPU driver (tests/data/wave5-sources/cudaprog.cu, on a CPU box).
    ("CUDA error: CUDA driver version is insufficient for CUDA runtime version at cudaprog.cu:37", FailureKind.OTHER),
    ("CUDA error: no CUDA-capable device is detected at src/kernels.cu:88", FailureKind.OTHER),
])
def test_cuda_errors_no_other_rule_knows_at_file_and_line(tmp_path: Path, line: str, kind: FailureKind) -> None:
    report = replay_lines(tmp_path, [line])
    assert report.failure is not None and report.failure.kind is kind and report.failure.line == line


@pytest.mark.parametrize("line", [
    # ollama 0.4.2 on ROCm 6.2.2, github.com/ollama/ollama/issues/7590
    "ggml.c:6712: GGML_ASSERT(a->ne[2] == b->ne[2]) failed",
    # vLLM on ROCm, github.com/vllm-project/vllm/issues/20007 (the title quotes the log's line)
    ":0:rocdevice.cpp :3020: 5875275709338d us: Callback: Queue 0x7f4580c00000 aborting with error : "
    "HSA_STATUS_ERROR_EXCEPTION: An HSAIL operation resulted in a hardware exception. code: 0x1016",
])
def test_ggml_and_rocm_aborts_are_failures(tmp_path: Path, line: str) -> None:
    report = replay_lines(tmp_path, ["load_tensors: offloaded 49/49 layers to GPU", line])
    assert report.failure is not None and report.failure.kind is FailureKind.OTHER and report.failure.line == line


# ---- where a failure is, and which exception of a chain is the root cause ----------------------------------


@pytest.mark.parametrize("path", [
    W5 / "jax-shape-error-jit.log",  # JAX: a TypeError tracing the first step
    W5 / "lightning-devices-4-on-1-gpu.log",  # Lightning: the Trainer refuses devices=4
    W5 / "cuda-cpp-malloc-oom.log",  # CUDA C++: the first cudaMalloc
    CORPUS / "device-logs/run-python-import-error.log",  # an earlier wave's Python import error
], ids=lambda p: p.name)
def test_a_failure_before_any_phase_is_a_failure_at_start_up(path: Path) -> None:
    report = replay(path)
    assert report.failure is not None and report.last_phase is Phase.STARTUP, (report.failure, report.last_phase)


@pytest.mark.parametrize("path, final", [
    (W5 / "torchrun-1proc-resume-chained.log",
     "RuntimeError: cannot resume: checkpoint /tmp/runs/exp7/checkpoint-1200/state.pt is missing"),
    (W5 / "triton-reshape-compile-error.log", "triton.compiler.errors.CompilationError: at 4:8:"),
    (CORPUS / "run-logs-2/vllm-0.6.3-serve-cpu-tokenizer-class-v5.log", "RuntimeError: Failed to load the tokenizer."),
], ids=lambda v: v.name if isinstance(v, Path) else str(v)[:20])
def test_the_root_cause_of_a_chain_raised_from_its_cause_is_its_final_exception(path: Path, final: str) -> None:
    report = replay(path)
    assert report.failure is not None and report.failure.line.startswith(final), report.failure


def test_an_oom_rewrapped_by_data_parallel_is_read_from_the_oom_itself(tmp_path: Path) -> None:
    # The shape torch prints when a replica of nn.DataParallel runs out of memory (ExceptionWrapper.reraise),
    # as in issue 51's unseen log and github.com/junyanz/pytorch-CycleGAN-and-pix2pix/issues/1499: the
    # wrapper's line names the exception's class only; the CUDA OOM message is in the Original Traceback.
    oom = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
           "of 23.67 GiB of which 1.59 GiB is free.")
    report = replay_lines(tmp_path, [
        "Traceback (most recent call last):",
        '  File "train.py", line 40, in <module>',
        "    out = model(batch)",
        '  File "/usr/lib/python3/site-packages/torch/_utils.py", line 694, in reraise',
        "    raise exception",
        "torch.OutOfMemoryError: Caught OutOfMemoryError in replica 0 on device 0.",
        "Original Traceback (most recent call last):",
        '  File "/usr/lib/python3/site-packages/torch/nn/parallel/parallel_apply.py", line 83, in _worker',
        "    output = module(*input, **kwargs)",
        oom,
    ])
    assert report.outcome is Outcome.OOM and report.failure is not None and report.failure.line == oom


@pytest.mark.parametrize("path", [
    W5 / "jax-oom-step-120.log",  # JAX 0.11 on an H100: `JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory ...`
    W5 / "cupy-fft-oom.log",  # CuPy's own OutOfMemoryError
], ids=lambda p: p.name)
def test_other_frameworks_ooms_are_ooms(path: Path) -> None:
    report = replay(path)
    assert report.outcome is Outcome.OOM and report.failure is not None, report.failure
