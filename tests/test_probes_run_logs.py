"""Classes of misread found by replaying real run logs (tests/data/corpus/run-logs/).

Each test replays the real log that showed the miss, or feeds its real lines, and where the rule
could reach too far, a contrasting case that must stay as it was.
"""

from __future__ import annotations

from pathlib import Path

from probe_helpers import report_of

from supervisor.core.events import FailureKind, Outcome, Phase
from supervisor.probes import replay_file

RUNS = Path(__file__).parent / "data" / "corpus" / "run-logs"


# ---- pydantic's ValidationError is a ValueError -------------------------------------------


def test_a_setting_refused_by_pydantic_at_start_up_is_a_config_error() -> None:
    report = replay_file(RUNS / "vllm-0.23-serve-max-model-len-too-long.log")
    assert report.failure is not None
    assert report.failure.line.endswith("pydantic_core._pydantic_core.ValidationError: 1 validation error for ModelConfig")
    assert (report.failure.kind, report.last_phase) == (FailureKind.CONFIG_ERROR, Phase.CONFIG)


def test_pydantic_validation_error_is_classified_only_as_pydantics() -> None:
    head = ["INFO 12-02 00:28:48 [api_utils.py:273] non-default args: {'tensor_parallel_size': 2, 'model': '/tmp/m'}",
            "Traceback (most recent call last):",
            '  File "/tmp/site/vllm/engine/arg_utils.py", line 1962, in create_engine_config', "    x()"]
    pydantic = report_of([*head, "pydantic_core._pydantic_core.ValidationError: 1 validation error for ParallelConfig",
                          "  Value error, World size (2) is larger than the number of available GPUs (1) in this node."])
    other = report_of([*head, "jsonschema.exceptions.ValidationError: 'model' is a required property"])
    assert pydantic.failure is not None and pydantic.failure.kind is FailureKind.CONFIG_ERROR
    assert other.failure is not None and other.failure.kind is FailureKind.OTHER


# ---- torchrun's rendezvous ------------------------------------------------------------------


def test_a_rendezvous_that_never_completes_is_a_distributed_timeout_in_distributed_init() -> None:
    report = replay_file(RUNS / "torchrun-rendezvous-join-timeout.log")
    assert report.failure is not None
    assert report.failure.line == "torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError"
    assert (report.failure.kind, report.last_phase) == (FailureKind.DISTRIBUTED_TIMEOUT, Phase.DISTRIBUTED_INIT)


# ---- a trainer's constructor is start-up ------------------------------------------------------


def test_a_key_error_while_trl_prepares_its_dataset_is_a_config_error() -> None:
    report = replay_file(RUNS / "trl-1.16-sft-bad-dataset-column.log")
    assert report.failure is not None and report.failure.line == "KeyError: 'text'"
    assert (report.failure.kind, report.last_phase) == (FailureKind.CONFIG_ERROR, Phase.STARTUP)


# ---- chained tracebacks: cleanup failing after the real error -----------------------------------


def test_an_exception_from_a_with_blocks_exit_yields_to_the_one_it_interrupted() -> None:
    report = replay_file(RUNS / "torch-save-checkpoint-disk-full.log")
    assert report.failure is not None
    assert report.failure.line == "RuntimeError: basic_ios::clear: iostream error"
    assert (report.failure.kind, report.last_phase) == (FailureKind.RUNTIME_ERROR, Phase.RUNNING)


def test_an_exception_raised_while_handling_another_outside_cleanup_still_wins() -> None:
    # Python's own chain around an import guard: the later, explicit error says more.
    report = report_of([
        "Traceback (most recent call last):", '  File "/app/model.py", line 3, in <module>', "    import flash_attn",
        "ModuleNotFoundError: No module named 'flash_attn'", "",
        "During handling of the above exception, another exception occurred:", "",
        "Traceback (most recent call last):", '  File "/app/model.py", line 5, in <module>',
        '    raise ImportError("FlashAttention2 is not installed; pip install flash-attn")',
        "ImportError: FlashAttention2 is not installed; pip install flash-attn"])
    assert report.failure is not None
    assert report.failure.line == "ImportError: FlashAttention2 is not installed; pip install flash-attn"


# ---- vLLM's orderly shutdown ends the work ---------------------------------------------------------


def test_an_offline_vllm_run_that_shuts_its_engine_down_is_done() -> None:
    report = replay_file(RUNS / "vllm-0.23-offline-deepseek-mla-moe-done.log")
    assert (report.outcome, report.last_phase, report.failure) == (Outcome.DONE, Phase.DONE, None)


def test_a_crash_before_the_shutdown_still_decides_the_outcome() -> None:
    report = replay_file(RUNS / "vllm-0.23-serve-kv-cache-no-memory.log")
    assert report.outcome is Outcome.CRASHED
    assert report.failure is not None and report.failure.line.endswith("ValueError: No available memory for the "
                                                                       "cache blocks. Try increasing "
                                                                       "`gpu_memory_utilization` when initializing "
                                                                       "the engine (this flag also controls CPU memory "
                                                                       "reservation on the CPU backend, despite its "
                                                                       "name). See https://docs.vllm.ai/en/latest/"
                                                                       "configuration/conserving_memory/ for more "
                                                                       "details.")


# ---- a worker's exception re-raised by torch ------------------------------------------------------


def test_a_dataloader_workers_original_exception_is_the_failure() -> None:
    report = replay_file(RUNS / "torch-dataloader-worker-keyerror.log")
    assert report.failure is not None
    assert report.failure.line == "KeyError: 'ids'"
    assert (report.failure.kind, report.last_phase) == (FailureKind.KEY_ERROR, Phase.RUNNING)
    assert report.counts["failure"] == 1  # the wrapper and the worker's traceback are one failure
