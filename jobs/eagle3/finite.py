"""Captured hidden states are checked for NaN and Inf before any of them is written.

A bad capture (an overflow in a low-precision layer, a broken kernel, a corrupt weight) used to show only
at training time, as a NaN loss hours later, with nothing naming where it came from. Each batch is checked
where it was computed: one ``isfinite().all()`` reduction over the batch on the device (a single sync; the
locating work below runs only when it fails), then the job stops with one line naming the first bad sample
and layer. A bad capture is a property of the model and the input, so a relaunch would meet it again: the
job's exit is final, not a retry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class NonFinite(RuntimeError):
    """A captured sample holds NaN or Inf values."""

    def __init__(self, sample: int, layer: int, nan: int, inf: int, token: int, layers: Sequence[int]):
        self.sample, self.layer = sample, layer
        also = [k for k in layers if k != layer]
        more = f"; also in layer{'s' if len(also) > 1 else ''} {', '.join(map(str, also))}" if also else ""
        super().__init__(f"non-finite hidden states in sample {sample} at layer {layer}: {nan} NaN and {inf} Inf "
                         f"values, the first at token {token}{more}; nothing of that sample was written")


def locate(hs: Any, sample: int, layer_ids: Sequence[int]) -> NonFinite | None:
    """The error for one sample's ``[T, n_layers, H]`` hidden states, or None when every value is finite."""
    import torch

    bad = ~torch.isfinite(hs)
    if not bool(bad.any()):
        return None
    per_layer = bad.any(dim=2).any(dim=0).tolist()  # [n_layers]
    layers = [k for k, b in zip(layer_ids, per_layer, strict=True) if b]
    j = list(layer_ids).index(layers[0])
    col = hs[:, j]
    token = int(bad[:, j].any(dim=1).nonzero()[0, 0])
    return NonFinite(sample, layers[0], int(torch.isnan(col).sum()), int(torch.isinf(col).sum()), token, layers)


def check_batch(hs: Any, lengths: Sequence[int], samples: Sequence[int], layer_ids: Sequence[int]) -> None:
    """Raise :class:`NonFinite` for the first sample of the batch ``hs`` ``[B, T, n_layers, H]`` (padded to T;
    sample b holds ``lengths[b]`` real tokens) with a non-finite value among its real tokens."""
    import torch

    if bool(torch.isfinite(hs).all()):
        return
    for b, (n, i) in enumerate(zip(lengths, samples, strict=True)):
        err = locate(hs[b, :n], i, layer_ids)
        if err is not None:
            raise err
    # Only padding positions were non-finite: they are never written.


def check_sample(hs: Any, sample: int, layer_ids: Sequence[int]) -> None:
    """Raise :class:`NonFinite` when one sample's ``[T, n_layers, H]`` holds a non-finite value."""
    import torch

    if bool(torch.isfinite(hs).all()):
        return
    err = locate(hs, sample, layer_ids)
    if err is not None:
        raise err
