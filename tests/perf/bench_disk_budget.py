"""The disk a budgeted EAGLE-3 pipeline holds, beside the unbounded run, and whether the drafts are the same.

    PYTHONPATH=jobs python tests/perf/bench_disk_budget.py [--samples 64] [--fraction 0.1] [--out DIR]

Unbounded: ``eagle3.extract`` of the first ``--samples`` shipped prompts (the tests' tiny 4-layer model, CPU,
batch 2, layer ids 1,2,3,4), then ``eagle3.train --order index --epochs 1``. Budgeted: ``eagle3.extract
--disk-budget B`` (B = ``--fraction`` of the unbounded run's sample bytes) and ``eagle3.train --order stream``
started together on a new directory. In both, a thread samples the bytes of ``hs_*.safetensors`` in the
extraction's directory every 10 ms (the peak is the largest sample seen), and the extraction reports its own
largest unconsumed total (manifest ``peak_unconsumed_bytes``). The drafts' ``model.safetensors`` are compared
tensor by tensor. Prints a markdown table; the logs go to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "jobs"))

EXTRACT = ["--batch-size", "2", "--layer-ids", "1,2,3,4", "--device", "cpu"]
TRAIN = ["--device", "cpu", "--epochs", "1", "--batch-size", "2", "--draft-vocab", "96", "--lr", "3e-3",
         "--threads", "1", "--log-every", "10", "--save-every", "1000", "--seed", "5"]


def env() -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("EAGLE3_")}
    e.update({"PYTHONPATH": str(REPO / "jobs"), "PYTHONUNBUFFERED": "1", "HF_HUB_OFFLINE": "1",
              "OMP_NUM_THREADS": "1"})
    return e


def sample_bytes(d: Path) -> int:
    n = 0
    for p in d.glob("hs_*.safetensors"):
        try:
            n += p.stat().st_size
        except FileNotFoundError:
            pass
    return n


class Sampler(threading.Thread):
    def __init__(self, d: Path):
        super().__init__(daemon=True)
        self.d, self.peak, self.stop = d, 0, threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            if self.d.is_dir():
                self.peak = max(self.peak, sample_bytes(self.d))
            time.sleep(0.01)


def start(module: str, args: list[str], log: Path) -> subprocess.Popen:
    f = open(log, "w")  # noqa: SIM115 - the child holds it; closed when the parent exits
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env(), stdout=f,
                            stderr=subprocess.STDOUT)


def weights(d: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(d / "model.safetensors"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--fraction", type=float, default=0.1)
    ap.add_argument("--out", type=Path, default=None, help="logs (default: a temporary directory)")
    a = ap.parse_args()
    from extract_helpers import build_test_model

    work = Path(tempfile.mkdtemp(prefix="bench-disk-budget-"))
    logs = a.out or work
    logs.mkdir(parents=True, exist_ok=True)
    model = build_test_model(work)
    ex = ["--model", str(model), "--max-samples", str(a.samples), *EXTRACT]
    rows = []

    d1, t1 = work / "unbounded-extract", work / "unbounded-train"
    s = Sampler(d1)
    s.start()
    t0 = time.monotonic()
    assert start("eagle3.extract", [*ex, "--out", str(d1)], logs / "unbounded-extract.log").wait() == 0
    s.stop.set()
    s.join()
    assert start("eagle3.train", ["--data", str(d1), "--out", str(t1), "--order", "index", *TRAIN],
                 logs / "unbounded-train.log").wait() == 0
    total = sample_bytes(d1)
    rows.append(("unbounded (extract, then train --order index)", time.monotonic() - t0, s.peak, None, None))

    limit = int(total * a.fraction)
    d2, t2 = work / "budget-extract", work / "budget-train"
    s = Sampler(d2)
    s.start()
    t0 = time.monotonic()
    tr = start("eagle3.train", ["--data", str(d2), "--out", str(t2), "--order", "stream", *TRAIN],
               logs / "budget-train.log")
    ex_p = start("eagle3.extract", [*ex, "--out", str(d2), "--disk-budget", str(limit)], logs / "budget-extract.log")
    assert ex_p.wait() == 0 and tr.wait() == 0
    s.stop.set()
    s.join()
    m = json.loads((d2 / "manifest.json").read_text())
    ledger = json.loads((d2 / "consumed.json").read_text())
    rows.append((f"budget {limit:,} B ({a.fraction:.0%}), extract and train --order stream at once",
                 time.monotonic() - t0, s.peak, m.get("peak_unconsumed_bytes"), ledger))

    wa, wb = weights(t1), weights(t2)
    same = wa.keys() == wb.keys() and all(bool((wa[k] == wb[k]).all()) for k in wa)
    pauses = sum(ln.startswith("extract paused:") for ln in (logs / "budget-extract.log").read_text().splitlines())
    ckpts = sum("checkpoint saved" in ln for ln in (logs / "budget-train.log").read_text().splitlines())
    print(f"{a.samples} samples, {total:,} bytes of hidden states; budget {limit:,} bytes")
    print("| run | wall s | peak hs_* bytes (sampled) | peak / all data | extraction's own peak unconsumed |")
    print("|---|---:|---:|---:|---:|")
    for name, wall, peak, own, _ in rows:
        print(f"| {name} | {wall:.1f} | {peak:,} | {peak / total:.1%} | {'' if own is None else f'{own:,}'} |")
    print(f"ledger: through {ledger['through']}, released {ledger['released_bytes']:,} bytes "
          f"(= all data: {ledger['released_bytes'] == total}); extraction pauses {pauses}; training checkpoints "
          f"{ckpts}; {len(wa)} tensors, bit-identical: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
