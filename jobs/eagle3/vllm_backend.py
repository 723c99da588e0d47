"""vLLM backend (GPU hosts, vLLM >= 0.18): the public ``extract_hidden_states`` method, in process.

The engine is vLLM's offline ``LLM`` with ``skip_tokenizer_init=True``, fed token-id prompts
(``TokensPrompt``) with ``max_tokens=1``. The ``extract_hidden_states`` speculative method
captures the layers named in ``eagle_aux_hidden_state_layer_ids`` (vLLM numbering: id k is the
input of decoder layer k, id L the last layer's output before the final norm) and the
``ExampleHiddenStatesConnector`` writes one safetensors file per request (``hidden_states`` bf16
``[T, n_layers, H]``, ``token_ids`` int64 ``[T]``) into a staging directory on the output disk,
named in the request output's ``kv_transfer_params["hidden_states_path"]``. Each such file is
checked against the sample from its header and token ids, and its hidden states for NaN/Inf
(``eagle3.finite``: one read, through the page cache its write just filled), then,
when it already is what the output layout reads (bf16 hidden states, int64 token ids, nothing else;
the loss masks are in ``prepared.safetensors`` or the speculators dataset), fsynced and renamed
into place as ``hs_{i}.safetensors``: written once, by vLLM. Otherwise (another dtype, SpecForge's
layout) it is read and rewritten. Either way
this runs in a small thread pool (``io_workers``), and the ``.lock`` companion is removed after.

Failure handling:

* a request that was aborted, returned no path, or whose file never became complete (or holds
  other token ids or shapes) is retried once in a later batch, then counted as failed;
* ``max_consecutive_failures`` failed attempts in a row abort the run (:class:`TooManyFailures`):
  an engine that fails every request should not chew through the whole set;
* a missing file when the staging disk has no room left is a full disk (:class:`DiskFull`);
* the staging directory is this launch's own (``eagle3.staging``): what killed launches left is
  removed by the next launch, and a live shard's staged files are never touched;
* the DeepSeek family cannot give id L (the final layer) on vLLM releases before
  :data:`FINAL_LAYER_MIN_VLLM`: 0.23.0 crashes on the first batch, after the full start-up,
  with ``The expanded size of the tensor (4) must match the existing size (3)``. That request is
  refused before anything loads (:class:`FinalLayerUnsupported`) unless forced. Read in 0.23.0's
  ``deepseek_v2.py``: ``DeepseekV2ForCausalLM`` does implement ``SupportsEagle3`` (default auxiliary
  layers ``(2, L // 2, L - 3)``), and its model captures an id k as the input of layer k, inside the
  layer loop only: id L is never reached, 3 states come back where 4 were asked. Ids below L work, so
  EAGLE-3 serving of this family with a draft is supported by 0.23.0; only the training data's last
  layer cannot come from it (the hf backend gives it).

vLLM is imported only here, and only by :func:`load_vllm_api`; tests pass a fake API object.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from . import _io, finite

MIN_VLLM = "0.18.0"
# 0.23.0 was seen failing on id L for DeepSeek-V2; later upstream code captures id L after the
# layer loop for this family. The first fixed release was not checked on hardware here: if a
# release at or above this one still fails, raise this value (or pass --force to try anyway).
FINAL_LAYER_MIN_VLLM = "0.24.0"
DEEPSEEK_FAMILY = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "kimi_k2", "kimi_k25",
                   "kimi_vl")


class FinalLayerUnsupported(RuntimeError):
    """The model family cannot give the final layer (id L) on this vLLM release."""


class VllmTooOld(RuntimeError):
    """The installed vLLM lacks the extract_hidden_states method."""


class TooManyFailures(RuntimeError):
    """Too many requests failed in a row."""


def version_tuple(v: str) -> tuple[int, ...]:
    """Leading numeric release of a version string: '0.23.1.dev3+gabc' -> (0, 23, 1)."""
    parts = []
    for p in v.split("+")[0].split("."):
        digits = ""
        for ch in p:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if len(digits) != len(p):
            break
    return tuple(parts)


def _older(v: str, than: str) -> bool:
    try:
        from packaging.version import Version

        return Version(v) < Version(than)
    except (ImportError, ValueError):  # no packaging, or a version it cannot parse (InvalidVersion is a ValueError)
        return version_tuple(v) < version_tuple(than)


def model_types(config: dict[str, Any]) -> list[str]:
    """model_type of a config.json and of its text_config (multimodal wrappers), if any."""
    out = [str(config.get("model_type", ""))]
    text = config.get("text_config")
    if isinstance(text, dict):
        out.append(str(text.get("model_type", "")))
    return [t for t in out if t]


def check_vllm(config: dict[str, Any], layer_ids: Sequence[int], num_layers: int, vllm_version: str,
               force: bool = False) -> str | None:
    """Refuse up front what this vLLM cannot do; returns a warning line when forced past it."""
    if _older(vllm_version, MIN_VLLM):
        raise VllmTooOld(f"vLLM {vllm_version} is too old: the extract_hidden_states method needs vLLM >= {MIN_VLLM}")
    types = model_types(config)
    family = any(t in DEEPSEEK_FAMILY for t in types) or any(
        "deepseek" in str(a).lower() or "kimi" in str(a).lower() for a in config.get("architectures") or ())
    if family and num_layers in layer_ids and _older(vllm_version, FINAL_LAYER_MIN_VLLM):
        msg = (f"layer id {num_layers} (the final layer's output) is not supported for model_type "
               f"{'/'.join(types) or '?'} by vLLM {vllm_version}: the DeepSeek family needs vLLM >= "
               f"{FINAL_LAYER_MIN_VLLM} for it (0.23.0 crashes on the first batch after the full start-up). "
               f"Drop {num_layers} from --layer-ids, upgrade vLLM, or pass --force to try anyway")
        if not force:
            raise FinalLayerUnsupported(msg)
        return "forced past: " + msg
    return None


def load_vllm_api() -> SimpleNamespace:
    """The parts of vLLM this backend uses (the only place vLLM is imported)."""
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    return SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams, TokensPrompt=TokensPrompt,
                           __version__=vllm.__version__)


def installed_vllm_version() -> str | None:
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("vllm")
    except PackageNotFoundError:
        return None


def llm_kwargs(model_dir: str, layer_ids: Sequence[int], staging_dir: str, *, max_model_len: int,
               gpu_memory_utilization: float = 0.85, enforce_eager: bool = True, tensor_parallel_size: int = 1,
               trust_remote_code: bool = False) -> dict[str, Any]:
    """Keyword arguments of ``LLM(...)`` for hidden-state extraction."""
    return dict(
        model=model_dir,
        skip_tokenizer_init=True,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        enforce_eager=enforce_eager,
        enable_chunked_prefill=False,
        # Every prompt token's hidden state is wanted: with prefix caching, a prompt that shares its first
        # blocks with an earlier one has those tokens served from the cache, and the connector writes
        # fewer rows (seen: 176 of 192, or none at all, on prompts opening with the same words).
        enable_prefix_caching=False,
        tensor_parallel_size=tensor_parallel_size,
        trust_remote_code=trust_remote_code,
        speculative_config={
            "method": "extract_hidden_states",
            "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {"eagle_aux_hidden_state_layer_ids": list(layer_ids)}},
        },
        kv_transfer_config={
            "kv_connector": "ExampleHiddenStatesConnector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"shared_storage_path": staging_dir},
        },
    )


class VllmBackend:
    name = "vllm"

    def __init__(self, model_dir: str, staging_dir: str | os.PathLike[str], *, api: Any = None,
                 max_model_len: int = 2049, gpu_memory_utilization: float = 0.85, enforce_eager: bool = True,
                 tensor_parallel_size: int = 1, trust_remote_code: bool = False, file_timeout_s: float = 120.0,
                 max_consecutive_failures: int = 8, retries: int = 1, log: Any = print,
                 io_workers: int | None = None):
        self.model_dir = model_dir
        self.staging = Path(staging_dir)
        self.api = api
        self.max_model_len = max_model_len
        self.gpu_memory_utilization = gpu_memory_utilization
        self.enforce_eager = enforce_eager
        self.tensor_parallel_size = tensor_parallel_size
        self.trust_remote_code = trust_remote_code
        self.file_timeout_s = file_timeout_s
        self.max_consecutive_failures = max_consecutive_failures
        self.retries = retries
        self.log = log
        self.io_workers = io_workers or min(4, os.cpu_count() or 1)
        self.llm: Any = None

    def load(self, layer_ids: Sequence[int]) -> None:
        if self.api is None:
            self.api = load_vllm_api()
        self.staging.mkdir(parents=True, exist_ok=True)
        self.llm = self.api.LLM(**llm_kwargs(
            self.model_dir, layer_ids, str(self.staging), max_model_len=self.max_model_len,
            gpu_memory_utilization=self.gpu_memory_utilization, enforce_eager=self.enforce_eager,
            tensor_parallel_size=self.tensor_parallel_size, trust_remote_code=self.trust_remote_code))

    def close(self) -> None:
        """Drop the engine (frees GPU memory before a --verify pass loads another model)."""
        llm, self.llm = self.llm, None
        if llm is None:
            return
        engine = getattr(llm, "llm_engine", None)
        shutdown = getattr(getattr(engine, "engine_core", None), "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except Exception as e:  # noqa: BLE001 - vLLM's shutdown may raise anything; the run's output is already on disk
                self.log(f"extract warning: vLLM engine shutdown failed: {type(e).__name__}: {e}")
        del llm

    # -- per-request handling -------------------------------------------------------------

    def _wait_complete(self, path: Path) -> bool:
        """Wait until ``path`` is a complete safetensors file (or the timeout passes).

        Newer connectors hold an exclusive flock on ``PATH.lock`` while writing: a shared lock is
        granted once the write is over (or at once for a stale lock file, whose writer is gone), and
        only then is the file taken. Without a lock file, a file as long as its header says is taken.
        """
        deadline = time.monotonic() + self.file_timeout_s
        lock = Path(str(path) + ".lock")
        released_at: float | None = None
        while True:
            locked = False
            if released_at is None:
                try:
                    fd = os.open(lock, os.O_RDONLY)
                except FileNotFoundError:
                    fd = None
                if fd is not None:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                        released_at = time.monotonic()
                    except BlockingIOError:
                        locked = True
                    finally:
                        os.close(fd)
            if not locked and _io.safetensors_header(path) is not None:
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            if released_at is not None and now - released_at > 2.0:
                return False  # the writer is done but left no complete file
            time.sleep(0.02)

    def _take(self, job: Any, i: int, out: Any) -> str | None:
        """Move request output ``out`` into place as sample ``i``; None on success, else why not."""
        import torch
        from safetensors import safe_open
        from safetensors.torch import load_file

        sample = job.samples[i]
        ptoks = getattr(out, "prompt_token_ids", None)
        if ptoks is not None and list(ptoks) != sample.token_ids:
            raise RuntimeError(f"vLLM returned the output of another prompt for sample {i}")
        comps = getattr(out, "outputs", None) or []
        reason = getattr(comps[0], "finish_reason", None) if comps else None
        params = getattr(out, "kv_transfer_params", None) or {}
        path_s = params.get("hidden_states_path")
        if reason == "abort":
            self._discard(path_s)
            return "request aborted"
        if not path_s:
            return "no hidden_states_path in the output"
        path = Path(path_s)
        if not self._wait_complete(path):
            need = sample.seq_len * len(job.layer_ids) * job.hidden * 2 + (1 << 20)
            try:
                free = shutil.disk_usage(path.parent).free
            except OSError:
                free = need
            if free < need:
                raise _io.DiskFull(path)
            self._discard(path_s)
            return f"hidden-states file {path.name} missing or incomplete after {self.file_timeout_s:.0f}s"
        header = _io.safetensors_header(path) or {}
        if "hidden_states" not in header or "token_ids" not in header:
            self._discard(path_s)
            return f"{path.name} lacks hidden_states or token_ids"
        want = [sample.seq_len, len(job.layer_ids), job.hidden]
        shape = header["hidden_states"].get("shape")
        if shape != want:
            self._discard(path_s)
            return f"{path.name} has hidden_states of shape {tuple(shape or ())}, expected {tuple(want)}"
        with safe_open(str(path), framework="pt", device="cpu") as f:
            if f.get_tensor("token_ids").tolist() != sample.token_ids:
                self._discard(path_s)
                return f"{path.name} holds other token ids than the sample"
            # vLLM wrote the file from the device: this is the first point the job sees the values, and the
            # last before the file becomes a sample (read back through the page cache its write just filled).
            try:
                finite.check_sample(f.get_tensor("hidden_states"), i, job.layer_ids)
            except finite.NonFinite:
                self._discard(path_s)
                raise
        if job.place_sample(i, path, header) is None:  # not in the output's layout: rewrite it
            job.write_sample(i, load_file(str(path))["hidden_states"].to(torch.bfloat16))
        self._discard(path_s)
        return None

    @staticmethod
    def _discard(path_s: str | None) -> None:
        if not path_s:
            return
        for p in (Path(path_s), Path(path_s + ".lock")):
            try:
                p.unlink()
            except FileNotFoundError:
                pass

    def run(self, job: Any, todo: Sequence[int]) -> list[int]:
        """Extract every sample of ``todo``; returns the indices that failed for good."""
        if self.llm is None:
            self.load(job.layer_ids)
        sp = self.api.SamplingParams(max_tokens=1, detokenize=False)
        queue = deque(todo)
        attempts: Counter[int] = Counter()
        failed: list[int] = []
        in_a_row = 0
        with ThreadPoolExecutor(self.io_workers, thread_name_prefix="eagle3-io") as pool:
            return self._loop(job, queue, attempts, failed, in_a_row, sp, pool)

    def _loop(self, job: Any, queue: deque[int], attempts: Counter[int], failed: list[int], in_a_row: int,
              sp: Any, pool: ThreadPoolExecutor) -> list[int]:
        while queue:
            batch = [queue.popleft() for _ in range(min(job.batch_size, len(queue)))]
            job.wait_for_room(batch)
            prompts = [self.api.TokensPrompt(prompt_token_ids=job.samples[i].token_ids) for i in batch]
            t0 = time.monotonic()
            outputs = self.llm.generate(prompts, sp)
            if len(outputs) != len(batch):
                raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(batch)} prompts")
            written = tokens = 0
            # Each output's file is checked and put into place in the pool; outcomes in batch order.
            futures = [pool.submit(self._take, job, i, out) for i, out in zip(batch, outputs, strict=True)]
            for i, fut in zip(batch, futures, strict=True):
                why = fut.result()
                if why is None:
                    written += 1
                    tokens += job.samples[i].seq_len
                    in_a_row = 0
                    continue
                attempts[i] += 1
                in_a_row += 1
                again = attempts[i] <= self.retries
                self.log(f"extract warning: sample {i} failed: {why}; "
                         + ("will retry" if again else "giving up on it for this launch"))
                (queue.append if again else failed.append)(i)
                if in_a_row >= self.max_consecutive_failures:
                    raise TooManyFailures(
                        f"{in_a_row} requests failed in a row (last: sample {i}: {why}); stopping. "
                        "Finished samples are kept; look at the engine's log above")
            job.batch_finished(written, tokens, time.monotonic() - t0)
            _io.batch_delay()
        return failed
