"""Acceptance of a trained draft estimated on held-out extracted samples, before serving it:
``PYTHONPATH=jobs python -m eagle3.heldout --draft OUT --data HELDOUT [--target-model M] [--steps 3]``.

``HELDOUT`` is an ``eagle3.extract`` output of prompts the draft was not trained on. For each loss-masked
anchor position the draft proposes ``steps`` tokens greedily, each from its own previous step (the
training-time-test unroll of ``eagle3.train``), and each proposal is compared with the target's argmax
(recomputed from the stored last-layer state). A proposal counts as accepted only when every earlier one
at that anchor was: ``accept_k`` is the share of anchors whose first ``k + 1`` proposals all match, and the
implied mean acceptance length is ``1 + sum(accept_k)``, what vLLM reports (accepted draft tokens plus the
target's own token, per verification step). ``rate_k = accept_k / accept_{k-1}`` is the conditional rate.

The unroll feeds the stored tokens, not the target's argmax: where they differ (data the target did not
write itself) the estimate conditions on text the target would not have produced. ``data_agreement``,
the share of masked tokens equal to the target's argmax at the step before, says how far that goes: 1.0 for
greedy regenerated answers, where the estimate is what greedy serving would see.

``coverage`` is the share of the held-out masked target tokens inside the draft vocabulary (``t2d``): the
ceiling a reduced ``--draft-vocab`` puts on acceptance. Prints one ``heldout:`` line and writes
``heldout.json`` into ``--draft``; missing inputs are one line, exit 78.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from . import _io
from .draft import Eagle3Draft
from .train import DataError, Dataset, Target, load_exported, load_target, open_dataset, pick_device, ttt_forward

EXIT_CONFIG = 78


@dataclass
class Estimate:
    samples: int
    anchors: int
    accept: list[float]  # accept[k]: share of anchors whose first k+1 proposals all match
    rate: list[float]  # accept[k] / accept[k-1]
    mean_acceptance_length: float
    coverage: float
    data_agreement: float


def chain_counts(hits: Sequence[torch.Tensor], valid: torch.Tensor) -> tuple[list[int], int]:
    """(anchors whose first k+1 proposals all hit, for each k; anchors) over the common prefix of the steps.

    ``hits[i]``: ``[B, m_i]``, step i's hit at anchor p (``m_i`` shrinks by one a step); ``valid``: ``[B, m]``
    for the shortest, the anchors whose every predicted token is loss-masked."""
    m = valid.shape[1]
    chain = torch.ones_like(valid)
    out = []
    for h in hits:
        chain = chain & h[:, :m] & valid
        out.append(int(chain.sum()))
    return out, int(valid.sum())


@torch.no_grad()
def estimate(draft: Eagle3Draft, target: Target, ds: Dataset, *, steps: int = 3, batch_size: int = 8,
             device: torch.device | str = "cpu", amp: torch.dtype | None = None) -> Estimate:
    device = torch.device(device)
    draft.eval()
    hit_sums, anchors = [0] * steps, 0
    cov_in, agree, masked, masked_next = 0, 0, 0, 0
    for s in range(0, len(ds), batch_size):
        batch = ds.batch(range(s, min(len(ds), s + batch_size)))
        hits: list[torch.Tensor] = []
        ttt_forward(draft, target, batch, steps, 1.0, device, amp, record=hits)
        mask = batch["mask"].to(device)
        t = mask.shape[1]
        m = max(t - 1 - steps, 0)
        valid = torch.ones(mask.shape[0], m, dtype=torch.bool, device=device)
        for i in range(steps):
            valid &= mask[:, 2 + i:2 + i + m]
        counts, n = chain_counts(hits, valid)
        hit_sums = [a + b for a, b in zip(hit_sums, counts, strict=True)]
        anchors += n
        ids = batch["ids"].to(device)
        cov_in += int((draft.t2d[ids] & mask).sum())
        masked += int(mask.sum())
        last = batch["last"].to(device)
        arg = target.logits(last.to(target.norm.dtype)).argmax(-1)  # [B, T]: the token after position p
        agree += int(((arg[:, :-1] == ids[:, 1:]) & mask[:, 1:]).sum())
        masked_next += int(mask[:, 1:].sum())
    accept = [c / max(anchors, 1) for c in hit_sums]
    rate = [a / p if p else 0.0 for a, p in zip(accept, [1.0, *accept[:-1]], strict=True)]
    return Estimate(samples=len(ds), anchors=anchors, accept=accept, rate=rate,
                    mean_acceptance_length=1.0 + sum(accept), coverage=cov_in / max(masked, 1),
                    data_agreement=agree / max(masked_next, 1))


def line(e: Estimate) -> str:
    acc = " ".join(f"accept_{k}={a:.3f}" for k, a in enumerate(e.accept))
    rate = " ".join(f"{r:.3f}" for r in e.rate)
    return (f"heldout: {e.samples} samples, {e.anchors} anchors, {acc}, rates {rate}, "
            f"mean acceptance length {e.mean_acceptance_length:.3f}, draft vocabulary coverage {e.coverage:.1%}, "
            f"data agreement {e.data_agreement:.1%}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle3.heldout",
                                 description="Estimate a draft's acceptance on held-out extracted samples.")
    ap.add_argument("--draft", required=True, help="an eagle3.train --out directory")
    ap.add_argument("--data", required=True, help="an eagle3.extract output of held-out prompts")
    ap.add_argument("--target-model", help="target model directory (default: the manifest's model)")
    ap.add_argument("--steps", type=int, default=3, help="proposals per anchor (speculative tokens)")
    ap.add_argument("--max-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args(argv)
    try:
        if args.steps < 1:
            raise DataError(f"--steps {args.steps}: at least 1")
        if not (Path(args.draft) / "config.json").is_file():
            raise DataError(f"--draft {args.draft}: no config.json; pass an eagle3.train --out directory")
        ds = open_dataset(args.data, args.max_len)
        model_dir = args.target_model or ds.manifest.get("model")
        if not model_dir:
            raise DataError(f"--data {args.data}: no manifest names the target model; pass --target-model")
        device = pick_device(args.device)
        target = load_target(model_dir, device, torch.float32)
        draft = load_exported(args.draft, device)
    except DataError as e:
        print(f"heldout error: {e}", flush=True)
        return EXIT_CONFIG
    est = estimate(draft, target, ds, steps=args.steps, batch_size=args.batch_size, device=device)
    print(line(est), flush=True)
    _io.atomic_write_json({**asdict(est), "data": str(Path(args.data).resolve()), "steps": args.steps},
                          Path(args.draft) / "heldout.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
