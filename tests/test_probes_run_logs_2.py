"""Classes of misread found by replaying the real logs of older vLLM, SGLang and Megatron runs
(tests/data/corpus/run-logs-2/).

Each test replays the real log that showed the miss, or feeds its real lines, with a contrasting
case where the rule could reach too far.
"""

from __future__ import annotations

from pathlib import Path

from probe_helpers import report_of

from supervisor.core.events import FailureKind, Phase
from supervisor.probes import replay_file

RUNS = Path(__file__).parent / "data" / "corpus" / "run-logs-2"


# ---- a progress bar left without a newline runs into a rank's traceback ----------------------

BAR = "Processed prompts:   0%|          | 0/4 [00:00<?, ?it/s, est. speed input: 0.00 toks/s, output: 0.00 toks/s]"
FRAMES = ['[rank0]:   File "/tmp/cv_vllm063/lib/python3.11/site-packages/vllm/entrypoints/llm.py", line 353, in generate',
          "[rank0]:     outputs = self._run_engine(use_tqdm=use_tqdm)",
          "[rank0]: TypeError: XFormersMetadata.__init__() got an unexpected keyword argument 'is_prompt'"]


def test_a_traceback_glued_to_a_bar_is_read_as_the_ranks_traceback() -> None:
    report = replay_file(RUNS / "vllm-0.6.3-offline-cpu-xformers-metadata-typeerror.log")
    assert report.failure is not None
    assert report.failure.line == "TypeError: XFormersMetadata.__init__() got an unexpected keyword argument 'is_prompt'"
    assert (report.failure.kind, report.last_phase) == (FailureKind.TYPE_ERROR, Phase.RUNNING)


def test_the_glued_lines_alone_blame_the_exception_not_the_bar() -> None:
    glued = report_of([BAR + "[rank0]: Traceback (most recent call last):", *FRAMES, "\r" + BAR])
    assert glued.failure is not None and glued.failure.kind is FailureKind.TYPE_ERROR
    assert glued.failure.line.startswith("TypeError: XFormersMetadata")


def test_text_before_a_traceback_without_a_prefix_stays_the_header() -> None:
    # No prefix stands before the marker: the line is one writer's, read as before.
    lines = ["Error executing job: Traceback (most recent call last):",
             '  File "/x/train.py", line 3, in <module>', "    main()", "KeyError: 'lr'"]
    report = report_of(lines)
    assert report.failure is not None and report.failure.line == "KeyError: 'lr'"


# ---- `raise X from Y`: the final exception says what failed, its cause stays in its traceback ----


def test_an_exception_raised_from_its_cause_is_blamed_on_the_final_one() -> None:
    # A chain's root cause is its final exception (issue 51: the first of a chain, chosen over the final
    # one, was a miss on unseen logs); vLLM's RuntimeError names what failed, the ValueError why.
    report = replay_file(RUNS / "vllm-0.6.3-serve-cpu-tokenizer-class-v5.log")
    assert report.failure is not None
    assert report.failure.line.startswith("RuntimeError: Failed to load the tokenizer.")
    assert (report.failure.kind, report.last_phase) == (FailureKind.RUNTIME_ERROR, Phase.CONFIG)
    chain = next(e.traceback for e in report.events if e.failure is not None and e.traceback)
    assert "ValueError: Tokenizer class TokenizersBackend does not exist" in (chain or "")


def test_an_exception_raised_while_handling_another_is_still_the_one_blamed() -> None:
    # "During handling of the above exception": the first was being handled; SGLang's
    # RuntimeError over the platform lookup's bare NotImplementedError says what is missing.
    report = replay_file(RUNS / "sglang-0.5.23-launch-server-no-accelerator.log")
    assert report.failure is not None
    assert report.failure.line == "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available."
    assert report.failure.kind is FailureKind.RUNTIME_ERROR


# ---- megatron-core builds its layers through build_module -------------------------------------


def test_an_assertion_while_megatron_builds_the_model_is_a_config_error_in_model_init() -> None:
    report = replay_file(RUNS / "megatron-core-0.16-heads-not-divisible-by-tp.log")
    assert report.failure is not None
    assert report.failure.line.startswith("AssertionError: 3 is not divisible by 2")
    assert (report.failure.kind, report.last_phase) == (FailureKind.CONFIG_ERROR, Phase.MODEL_INIT)


def test_an_assertion_before_megatron_builds_anything_keeps_its_kind() -> None:
    # initialize_megatron's "requires CUDA": the box lacks a GPU; no frame says start-up settings.
    report = replay_file(RUNS / "megatron-lm-0.16-pretrain-gpt-requires-cuda.log")
    assert report.failure is not None
    assert (report.failure.line, report.failure.kind) == ("AssertionError: Megatron requires CUDA.", FailureKind.ASSERTION)
