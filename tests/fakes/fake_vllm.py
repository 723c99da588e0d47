"""A fake of the slice of vLLM's offline API that ``eagle3.vllm_backend`` uses.

It behaves as the real ``LLM`` does with the ``extract_hidden_states`` speculative method and
the ``ExampleHiddenStatesConnector`` (see shared/gpu/vllm_extract_example.py): for each token-id
prompt it writes ``{shared_storage_path}/{request_id}.safetensors`` holding ``hidden_states``
bf16 ``[T, n_layers, H]`` and ``token_ids`` int64 ``[T]``, under an exclusive flock on the
companion ``.lock`` file (left behind, as the connector leaves it), and returns request outputs
whose ``kv_transfer_params["hidden_states_path"]`` names that file. As in vLLM 0.23, the request id
a caller sees counts up from 0 for each ``LLM``, while the engine's own id (the one the connector names
the file after) carries a random suffix (``{n}-{8 hex}``: ``InputProcessor.assign_request_id``), so two
processes staging into one directory never write the same name. ``generate`` returns once the batch's
last file is written (the connector writes each request's file as it finishes, the call returns after
the last); with ``gate`` set, it then waits until that path exists, as a batch whose last request is
still computing keeps the caller waiting while the earlier files lie staged.

Faults are injected per request with ``faults(request_number, token_ids) -> str | None``:

* ``"abort"``: finish_reason "abort", no file;
* ``"no_path"``: the output carries no kv_transfer_params;
* ``"missing"``: a path is returned, but no file is ever written (a failed writer thread);
* ``"partial"``: the file is cut short (a writer that died half-way);
* ``"late"``: the file is written 0.3 s after ``generate`` returns, with the lock held until then;
* ``"prealloc"``: as "late", but the file first appears at full length with its header and zeroed
  data (a writer that sets the length and header before writing the data);
* ``"stale_lock"``: only an unheld ``.lock`` file is left, no data file;
* ``"wrong_tokens"``: the file holds other token ids.

Prefix caching is on unless ``enable_prefix_caching=False`` (vLLM's default): a prompt whose first
full blocks of 16 tokens were computed for an earlier prompt has them served from the cache, and the
connector writes rows for the computed tokens only, as seen with vLLM 0.23 on an H200 (192-token
prompts written with 176 rows; tests/perf/results/eagle3-e2e-h200/logs/eagle3.extract-attempt-1.log).

Hidden states come from ``hidden_fn(token_ids, layer_ids) -> tensor [T, n, H]`` (default: a
deterministic function of the tokens, positions and layer ids).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
from safetensors.torch import save


class FakeSamplingParams:
    def __init__(self, max_tokens: int = 16, detokenize: bool = True, **kwargs: Any):
        self.max_tokens = max_tokens
        self.detokenize = detokenize
        self.extra = kwargs


def FakeTokensPrompt(**kwargs: Any) -> dict[str, Any]:
    return dict(kwargs)


@dataclass
class FakeCompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None


@dataclass
class FakeRequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[FakeCompletionOutput]
    finished: bool = True
    kv_transfer_params: dict[str, Any] | None = None


def default_hidden_fn(hidden: int) -> Callable[[list[int], list[int]], torch.Tensor]:
    def fn(token_ids: list[int], layer_ids: list[int]) -> torch.Tensor:
        t = torch.tensor(token_ids, dtype=torch.float32)[:, None, None]
        pos = torch.arange(len(token_ids), dtype=torch.float32)[:, None, None]
        lay = torch.tensor(layer_ids, dtype=torch.float32)[None, :, None]
        col = torch.arange(hidden, dtype=torch.float32)[None, None, :]
        return torch.sin(t * 0.37 + pos * 0.11 + lay * 1.3 + col * 0.07).to(torch.bfloat16)
    return fn


BLOCK = 16  # vLLM's default KV-cache block size on CUDA


@dataclass
class FakeLLM:
    """Stands in for ``vllm.LLM``; check ``kwargs`` to see what the backend asked for."""

    model: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    faults: Callable[[int, list[int]], str | None] | None = None
    hidden_fn: Callable[[list[int], list[int]], torch.Tensor] | None = None
    calls: list[list[list[int]]] = field(default_factory=list)
    gate: Path | None = None
    step_s: float = 0.0  # each request's compute time: its file appears, then the next request runs
    _next_id: int = 0

    def __post_init__(self) -> None:
        spec = self.kwargs["speculative_config"]
        assert spec["method"] == "extract_hidden_states", spec
        assert spec["num_speculative_tokens"] == 1, spec
        self.layer_ids = list(spec["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"])
        kv = self.kwargs["kv_transfer_config"]
        assert kv["kv_connector"] == "ExampleHiddenStatesConnector" and kv["kv_role"] == "kv_producer", kv
        self.storage = Path(kv["kv_connector_extra_config"]["shared_storage_path"])
        if self.kwargs.get("enable_chunked_prefill") is not False:
            raise ValueError("ExampleHiddenStatesConnector needs enable_chunked_prefill=False")
        cfg = json.loads((Path(self.model) / "config.json").read_text())
        n = cfg["num_hidden_layers"]
        if any(not 0 <= k <= n for k in self.layer_ids):
            raise ValueError(f"layer ids {self.layer_ids} out of range for {n} layers")
        if self.hidden_fn is None:
            self.hidden_fn = default_hidden_fn(cfg["hidden_size"])
        self._threads: list[threading.Thread] = []
        self.prefix_caching = self.kwargs.get("enable_prefix_caching", True) is not False
        self._cached_blocks: set[tuple[int, ...]] = set()

    def _computed_from(self, ids: list[int]) -> int:
        """How many leading tokens the prefix cache serves (whole blocks, never the last token)."""
        if not self.prefix_caching:
            return 0
        hit = 0
        for end in range(BLOCK, len(ids), BLOCK):
            if tuple(ids[:end]) not in self._cached_blocks:
                break
            hit = end
        self._cached_blocks.update(tuple(ids[:end]) for end in range(BLOCK, len(ids) + 1, BLOCK))
        return hit

    def generate(self, prompts: list[dict[str, Any]], sampling_params: FakeSamplingParams,
                 use_tqdm: bool = True) -> list[FakeRequestOutput]:
        assert sampling_params.max_tokens == 1
        self.calls.append([list(p["prompt_token_ids"]) for p in prompts])
        outs = []
        for p in prompts:
            ids = list(p["prompt_token_ids"])
            if len(ids) + sampling_params.max_tokens > self.kwargs["max_model_len"]:
                raise ValueError(f"prompt of {len(ids)} tokens is too long for max_model_len "
                                 f"{self.kwargs['max_model_len']}")
            req_id = str(self._next_id)
            self._next_id += 1
            fault = self.faults(self._next_id - 1, ids) if self.faults else None
            path = self.storage / f"{req_id}-{uuid.uuid4().hex[:8]}.safetensors"  # the engine's own id
            params: dict[str, Any] | None = {"hidden_states_path": str(path)}
            finish = "length"
            if fault == "abort":
                params, finish = None, "abort"
            elif fault == "no_path":
                params = None
            elif fault == "missing":
                pass
            elif fault == "stale_lock":
                Path(str(path) + ".lock").touch()
            else:
                file_ids = [i + 1 for i in ids] if fault == "wrong_tokens" else ids
                start = self._computed_from(ids)
                data = save({"hidden_states": self.hidden_fn(ids, self.layer_ids)[start:].contiguous(),
                             "token_ids": torch.tensor(file_ids[start:], dtype=torch.int64)})
                if fault == "partial":
                    data = data[: len(data) // 2]
                if fault == "prealloc":
                    path.parent.mkdir(parents=True, exist_ok=True)
                    head = 8 + int.from_bytes(data[:8], "little")
                    path.write_bytes(data[:head] + bytes(len(data) - head))
                self._write_locked(path, data, delay=0.3 if fault in ("late", "prealloc") else 0.0)
            if self.step_s:
                time.sleep(self.step_s)
            outs.append(FakeRequestOutput(req_id, ids, [FakeCompletionOutput(0, "", [0], finish)],
                                          True, params))
        self._hold()
        return outs

    def _hold(self) -> None:
        """With a gate: the batch's files are staged, and the call returns only once the gate opens."""
        if self.gate is None or self.gate.exists():
            return
        print(f"fake vllm: batch staged, holding for {self.gate}", file=sys.stderr, flush=True)
        while not self.gate.exists():
            time.sleep(0.02)

    def _write_locked(self, path: Path, data: bytes, delay: float) -> None:
        self.storage.mkdir(parents=True, exist_ok=True)
        lock_fd = os.open(str(path) + ".lock", os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o644)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)

        def write() -> None:
            try:
                if delay:
                    time.sleep(delay)
                try:
                    path.write_bytes(data)
                except OSError as e:  # the real writer thread logs and drops the file
                    if e.errno != errno.ENOSPC:
                        raise
                    path.unlink(missing_ok=True)
            finally:
                os.close(lock_fd)

        if delay:
            th = threading.Thread(target=write, daemon=True)
            th.start()
            self._threads.append(th)
        else:
            write()


def make_api(version: str = "0.23.0", faults: Callable[[int, list[int]], str | None] | None = None,
             hidden_fn: Callable[[list[int], list[int]], torch.Tensor] | None = None,
             gate: Path | None = None, step_s: float = 0.0) -> SimpleNamespace:
    """A stand-in for the ``vllm`` module: ``LLM``, ``SamplingParams``, ``TokensPrompt``, ``__version__``.

    Every ``LLM`` it makes is appended to ``api.llms``.
    """
    api = SimpleNamespace(SamplingParams=FakeSamplingParams, TokensPrompt=FakeTokensPrompt,
                          __version__=version, llms=[])

    def LLM(model: str, **kwargs: Any) -> FakeLLM:
        llm = FakeLLM(model, kwargs, faults=faults, hidden_fn=hidden_fn, gate=gate, step_s=step_s)
        api.llms.append(llm)
        return llm

    api.LLM = LLM
    return api
