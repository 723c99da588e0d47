"""Offline `supervise probe` on a log of a million progress redraws stays within bounded memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REDRAWS = 1_000_000
LIMIT_MB = 200

# Runs the CLI as its only child and prints that child's peak RSS (KiB on Linux), so nothing
# else this test process ever started can count.
_MEASURE = """\
import json, resource, subprocess, sys
proc = subprocess.run([sys.executable, "-m", "supervisor.cli", *sys.argv[1:]], capture_output=True, text=True)
print(json.dumps({"rc": proc.returncode, "out": proc.stdout, "err": proc.stderr,
                  "maxrss_kib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))
"""


def _tqdm_log(path: Path) -> None:
    """tqdm's file output: every redraw starts with \\r and none ends; then a crash."""
    total = REDRAWS
    with open(path, "wb") as f:
        f.writelines("".join(f"\rTraining:  {100 * i // total}%|#####     | {i}/{total} [01:02<03:04, 5.00it/s]"
                             for i in range(start + 1, start + 10_001)).encode()
                     for start in range(0, total, 10_000))
        f.write(b"\nTraceback (most recent call last):\n  File \"train.py\", line 1, in <module>\n"
                b"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\n")


def test_probe_on_a_million_redraws_peaks_under_200_mb(tmp_path: Path) -> None:
    log = tmp_path / "tqdm.log"
    _tqdm_log(log)
    result = subprocess.run([sys.executable, "-c", _MEASURE, "probe", "--json", str(log)], capture_output=True,
                            text=True, timeout=600, cwd=REPO, check=True)
    measured = json.loads(result.stdout)
    assert measured["rc"] == 1, measured["err"]  # the crash at the end is still found
    report = json.loads(measured["out"])
    assert report["outcome"] in ("crashed", "oom")
    assert [(p["bar"], p["done"], p["total"]) for p in report["progress"]] == [("Training", REDRAWS, REDRAWS)]
    assert measured["maxrss_kib"] < LIMIT_MB * 1024, f"peak RSS {measured['maxrss_kib'] // 1024} MB"


def test_probe_listing_many_events_peaks_under_200_mb(tmp_path: Path) -> None:
    """Every line an event (150,000 listed): held as objects until the JSON was printed they
    peaked at 306 MB; spooled to disk as they come, memory stays flat."""
    log = tmp_path / "steps.log"
    with open(log, "w", encoding="utf-8") as f:
        f.writelines(f"{{'loss': 0.{i % 97}, 'grad_norm': 1.0, 'learning_rate': 0.0001, 'epoch': {i}}}\n"
                     for i in range(150_000))
    result = subprocess.run([sys.executable, "-c", _MEASURE, "probe", "--json", str(log)], capture_output=True,
                            text=True, timeout=600, cwd=REPO, check=True)
    measured = json.loads(result.stdout)
    assert measured["rc"] == 0, measured["err"]
    report = json.loads(measured["out"])
    assert len(report["events"]) == 100_000 and report["events_omitted"] == 50_000
    assert report["events"][-1]["line"].endswith("'epoch': 99999}")
    assert measured["maxrss_kib"] < LIMIT_MB * 1024, f"peak RSS {measured['maxrss_kib'] // 1024} MB"


def test_probe_on_a_bar_redrawn_blank_millions_of_times_peaks_under_200_mb(tmp_path: Path) -> None:
    """A stream of carriage returns alone (a bar cleared and redrawn blank, 4 MB): every \\r was an
    empty record, four million in one chunk's list, 690 MB at peak on b37886f.  The redraws between
    a run's first and last are no longer split."""
    log = tmp_path / "blank.log"
    log.write_bytes(b"\r" * 4_000_000 + b"\nKilled\n")
    result = subprocess.run([sys.executable, "-c", _MEASURE, "probe", "--json", str(log)], capture_output=True,
                            text=True, timeout=600, cwd=REPO, check=True)
    measured = json.loads(result.stdout)
    report = json.loads(measured["out"])
    assert report["outcome"] == "crashed", measured["err"]
    assert measured["maxrss_kib"] < LIMIT_MB * 1024, f"peak RSS {measured['maxrss_kib'] // 1024} MB"
