"""The EAGLE-3 end-to-end table from eagle3_e2e.sh's output folder: ``python e2e_table.py OUT [none LABEL…]``.

Reads ``OUT/bench/{none,draft,quarter}.json`` (e2e_bench.py; other labels when named: the first is the run
without a draft, mla_real_vocab.sh names its drafts), the target's ``e2e_target.json`` and each
draft's ``train_info.json``; prints markdown: per setting tokens/s without and with each draft, the
acceptance rate and mean acceptance length, and whether greedy output with a draft is token-identical
to greedy output without one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def same_tokens(a: list[dict], b: list[dict]) -> tuple[int, int]:
    """(identical completions, completions compared); token ids where the server returned them."""
    key = "token_ids" if all(o.get("token_ids") for o in a + b) else "text"
    return sum(x[key] == y[key] for x, y in zip(a, b, strict=False)), min(len(a), len(b))


def last_step(run: Path) -> str:
    logs = sorted(run.glob("logs-eagle3.train/*.log"))
    steps = [ln.strip() for ln in logs[-1].read_text().splitlines() if ln.startswith("train step ")] if logs else []
    return steps[-1] if steps else "(no log)"


def main(out: Path, labels: list[str] | None = None) -> int:
    if labels:
        return table(out, labels[0], labels[1:])
    bench = {k: load(out / "bench" / f"{k}.json") for k in ("none", "draft", "quarter")}
    target = load(out / "e2e_target.json") or {}
    info = {k: load(out / k / "train_info.json") or {} for k in ("full", "quarter")}
    lines = ["### EAGLE-3 end to end on one H200 (small trained target)", ""]
    if target:
        lines.append(f"Target: Llama {target.get('size')} trained {target.get('steps')} steps "
                     f"({target.get('train_s')} s) on synthetic text, final loss {target.get('final_loss', 0):.3f}, "
                     f"vocab {target.get('vocab')}.")
    for k, label in (("full", "draft"), ("quarter", "quarter draft")):
        i, last = info[k], last_step(out / k)
        if i:
            lines.append(f"{label}: {i['steps']} steps in {i['seconds']} s on {i['run']['draft']['hidden_size']}-wide "
                         f"hidden states; last line `{last}`")
    lines += ["", "| setting | tok/s no draft | tok/s draft (×) | acceptance | mean acc. length | "
              "tok/s quarter (×) | acceptance | mean acc. length |", "|---|---|---|---|---|---|---|---|"]
    base = bench["none"]
    if not base:
        print("\n".join([*lines, "(no baseline run)"]))
        return 1
    for i, s in enumerate(base["settings"]):
        row = [f"batch {s['batch']}, T={s['temperature']}", f"{s['tok_s']:.0f}"]
        for k in ("draft", "quarter"):
            d = bench[k]["settings"][i] if bench[k] else None
            row += ([f"{d['tok_s']:.0f} ({d['tok_s'] / s['tok_s']:.2f}×)", f"{d['acceptance_rate']}",
                     f"{d['mean_acceptance_length']}"] if d else ["–", "–", "–"])
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for k in ("draft", "quarter"):
        if not bench[k]:
            continue
        for i, s in enumerate(base["settings"]):
            if s["temperature"] == 0.0:
                n, m = same_tokens(s["outputs"], bench[k]["settings"][i]["outputs"])
                lines.append(f"Greedy, batch {s['batch']}, {k}: {n}/{m} completions token-identical to no draft.")
        pp = [d["acceptance_per_pos"] for d in bench[k]["settings"]]
        lines.append(f"{k}: acceptance per position (per setting): {pp}")
    print("\n".join(lines))
    return 0


def table(out: Path, none: str, drafts: list[str]) -> int:
    """One row per setting and draft: tok/s without and with the draft, the speed-up, acceptance, mean
    acceptance length, acceptance per position; then greedy identity per draft."""
    base = load(out / "bench" / f"{none}.json")
    if not base:
        print("(no baseline run)")
        return 1
    lines = ["| setting | draft | tok/s no draft | tok/s draft | × | acceptance | mean acc. length | per position |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    runs = {k: load(out / "bench" / f"{k}.json") for k in drafts}
    for i, s in enumerate(base["settings"]):
        for k, run in runs.items():
            if not run:
                continue
            d = run["settings"][i]
            lines.append(f"| batch {s['batch']}, T={s['temperature']} | {k} | {s['tok_s']:,.0f} | {d['tok_s']:,.0f} | "
                         f"{d['tok_s'] / s['tok_s']:.2f}× | {d['acceptance_rate']} | {d['mean_acceptance_length']} | "
                         f"{' / '.join(f'{x:.2f}' for x in d['acceptance_per_pos'])} |")
    lines.append("")
    for k, run in runs.items():
        for i, s in enumerate(base["settings"]):
            if run and s["temperature"] == 0.0:
                n, m = same_tokens(s["outputs"], run["settings"][i]["outputs"])
                lines.append(f"Greedy, batch {s['batch']}, {k}: {n}/{m} completions token-identical to no draft.")
        if not run:
            lines.append(f"{k}: no bench run")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
