"""transformers backend: runs anywhere torch runs (a CPU too); the reference for ``--verify``.

Layer numbering follows vLLM: id k < L is the input of decoder layer k (what transformers
returns as ``hidden_states[k]`` with ``output_hidden_states=True``); id L is the output of the
last decoder layer *before* the final norm (transformers' ``hidden_states[L]`` is after the norm
for Llama). Both are captured with hooks on the decoder layers: a forward pre-hook on layer k
for k < L, a forward hook on layer L-1 for L. The forward stops after the last layer needed.

Batches are fixed chunks of the sample index range (``[k*B, (k+1)*B)``), right-padded, with no
attention mask: causal attention keeps the real tokens from seeing the padding at their right,
and a sample is always computed in the same batch with the same shapes, so a relaunch that
recomputes a partly finished chunk writes the same bytes as an uninterrupted run. Finished
samples of such a chunk are not written again.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any


class _StopForward(Exception):
    """Raised from a hook once every requested layer is captured."""


def pick_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def load_model(model_dir: str, device: str = "cpu", dtype: str = "auto", trust_remote_code: bool = False):
    """Load the causal LM (transformers prints its own weight-loading bar) on ``device``, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    torch_dtype: Any = "auto" if dtype == "auto" else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch_dtype, trust_remote_code=trust_remote_code,
                                                 local_files_only=True)
    model.to(pick_device(device))
    model.eval()
    return model


def decoder_layers(model: Any, num_layers: int):
    """The decoder's ModuleList of ``num_layers`` layers."""
    import torch

    base = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if isinstance(layers, torch.nn.ModuleList) and len(layers) == num_layers:
        return base, layers
    for _, mod in model.named_modules():
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == num_layers:
            return base, mod
    raise RuntimeError(f"cannot find the {num_layers} decoder layers of {type(model).__name__}")


class HiddenStateCapture:
    """Forward hooks that collect the requested layer ids (vLLM numbering) during one forward."""

    def __init__(self, layers: Any, layer_ids: Sequence[int]):
        self.layers = layers
        self.layer_ids = list(layer_ids)
        self.num_layers = len(layers)
        self.captured: dict[int, Any] = {}
        self._handles: list[Any] = []
        self._last_needed = max(self.layer_ids)

    def _pre_hook(self, k: int) -> Callable:
        def hook(module, args, kwargs):
            h = args[0] if args else kwargs["hidden_states"]
            self.captured[k] = h.detach()
            if k == self._last_needed:
                raise _StopForward
        return hook

    def _post_hook(self, k: int) -> Callable:
        def hook(module, args, output):
            h = output[0] if isinstance(output, (tuple, list)) else output
            self.captured[k] = h.detach()
            raise _StopForward
        return hook

    def __enter__(self) -> HiddenStateCapture:
        for k in self.layer_ids:
            if k < self.num_layers:
                self._handles.append(self.layers[k].register_forward_pre_hook(self._pre_hook(k), with_kwargs=True))
            else:
                self._handles.append(self.layers[self.num_layers - 1].register_forward_hook(self._post_hook(k)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def run(self, base_model: Any, input_ids: Any):
        """Forward ``input_ids`` [B, T]; returns the captures stacked as [B, T, n_layers, H]."""
        import torch

        self.captured.clear()
        try:
            with torch.inference_mode():
                base_model(input_ids=input_ids, use_cache=False)
        except _StopForward:
            pass
        missing = [k for k in self.layer_ids if k not in self.captured]
        if missing:
            raise RuntimeError(f"layer ids {missing} were not captured")
        return torch.stack([self.captured[k] for k in self.layer_ids], dim=2)


def chunks_to_run(total: int, batch_size: int, todo: set[int]):
    """Fixed index chunks that hold at least one sample of ``todo``."""
    for start in range(0, total, batch_size):
        idx = list(range(start, min(total, start + batch_size)))
        if any(i in todo for i in idx):
            yield idx


class HFBackend:
    name = "hf"

    def __init__(self, model_dir: str, *, device: str = "cpu", dtype: str = "auto",
                 trust_remote_code: bool = False, pad_token_id: int = 0, model: Any = None):
        self.model_dir = model_dir
        self.device = pick_device(device)
        self.dtype = dtype
        self.trust_remote_code = trust_remote_code
        self.pad_token_id = pad_token_id
        self.model = model

    def load(self) -> None:
        if self.model is None:
            self.model = load_model(self.model_dir, self.device, self.dtype, self.trust_remote_code)

    def forward(self, token_lists: Sequence[Sequence[int]], layer_ids: Sequence[int], num_layers: int):
        """Hidden states of a batch as one bf16 tensor [B, T, n_layers, H] on the device (padded to T)."""
        import torch

        self.load()
        base, layers = decoder_layers(self.model, num_layers)
        tmax = max(len(t) for t in token_lists)
        ids = torch.full((len(token_lists), tmax), self.pad_token_id, dtype=torch.int64)
        for b, t in enumerate(token_lists):
            ids[b, : len(t)] = torch.tensor(t, dtype=torch.int64)
        with HiddenStateCapture(layers, layer_ids) as cap:
            hs = cap.run(base, ids.to(self.device))
        return hs.to(torch.bfloat16)

    @staticmethod
    def split(hs: Any, token_lists: Sequence[Sequence[int]]):
        """A batch from :meth:`forward` as a list of CPU tensors [T_i, n_layers, H]."""
        hs = hs.cpu()
        return [hs[b, : len(t)].contiguous() for b, t in enumerate(token_lists)]

    def compute(self, token_lists: Sequence[Sequence[int]], layer_ids: Sequence[int], num_layers: int):
        """Hidden states of a batch: a list of bf16 CPU tensors [T_i, n_layers, H]."""
        return self.split(self.forward(token_lists, layer_ids, num_layers), token_lists)

    def run(self, job: Any, todo: Sequence[int]) -> list[int]:
        """Extract every sample of ``todo``; returns the failed indices (always empty: errors raise)."""
        from . import _io, finite

        self.load()
        todo_set = set(todo)
        part = job.part  # the samples this run extracts (a shard's part), batched in fixed chunks of it
        todo_at = {k for k, i in enumerate(part) if i in todo_set}
        for chunk in chunks_to_run(len(part), job.batch_size, todo_at):
            samples = [job.samples[part[k]] for k in chunk]
            job.wait_for_room([s.index for s in samples])
            t0 = time.monotonic()
            tokens = [s.token_ids for s in samples]
            hs = self.forward(tokens, job.layer_ids, job.num_layers)
            # On the device, before anything of the batch is written (eagle3.finite).
            finite.check_batch(hs, [s.seq_len for s in samples], [s.index for s in samples], job.layer_ids)
            outs = self.split(hs, tokens)
            written = 0
            for s, hs in zip(samples, outs, strict=True):
                if s.index in todo_set and not job.is_done(s.index):
                    job.write_sample(s.index, hs)
                    written += 1
            job.batch_finished(written, sum(s.seq_len for s in samples), time.monotonic() - t0)
            _io.batch_delay()
        return []

