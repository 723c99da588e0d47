"""Probe throughput: all built-in packs vs ``grep -E -f`` on the same patterns and data.

    .venv/bin/python tests/perf/bench_probes.py [--mb 100] [--keep DIR]

Builds a large log by repeating the corpus logs (tests/data/corpus/**/*.log) up to
``--mb`` megabytes, then in one run measures:

- the probe engine with every built-in pack, reading the file the way the daemon does:
  chunks of bytes, ``records.split_records``, then the engine, both record by record
  (``feed``) and batch by batch (``feed_many``);
- ``grep -E -c -f patterns.txt`` over the same file, where patterns.txt holds the same
  probe regexes exported as POSIX ERE (those that have an ERE form), in the default
  locale and in the C locale.

Times are wall-clock and CPU seconds (the machine may be shared); ratios use CPU time.
Prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from supervisor.probes import ProbeEngine, load_packs  # noqa: E402
from supervisor.probes._ere import to_posix_ere  # noqa: E402
from supervisor.records import split_records  # noqa: E402

CORPUS = ROOT / "tests" / "data" / "corpus"
CHUNK = 1 << 20  # what the follower reads at a time when a log is busy
# The engine also recognises tracebacks (not a probe regex); grep gets their markers too.
TRACEBACK_ERE = [r"Traceback \(most recent call last\):", r'^[[:space:]]+File "[^"]*", line [0-9]+']


@dataclass
class Timing:
    label: str
    wall: float
    cpu: float
    size: int
    note: str

    @property
    def mb_s(self) -> float:
        return self.size / 1e6 / self.cpu if self.cpu else float("inf")


def build_log(path: Path, megabytes: float) -> int:
    logs = sorted(p for p in CORPUS.rglob("*.log"))
    unit = b"".join(p.read_bytes().rstrip(b"\n") + b"\n" for p in logs)
    copies = max(1, int(megabytes * 1e6 // len(unit)) + 1)
    path.write_bytes(unit * copies)
    return len(unit) * copies


def export_patterns(path: Path) -> tuple[int, int, list[str]]:
    total = 0
    patterns: list[str] = []
    untranslatable: list[str] = []
    for pack in load_packs():
        for probe in pack.probes:
            total += 1
            ere = to_posix_ere(probe.regex)
            if ere is None:
                untranslatable.append(probe.name)
            else:
                patterns.append(ere)
    path.write_text("\n".join(patterns + TRACEBACK_ERE) + "\n", encoding="utf-8")
    return total, len(patterns), untranslatable


def run_engine(path: Path, size: int, batched: bool) -> Timing:
    engine = ProbeEngine(load_packs())
    events = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    with path.open("rb") as handle:
        pending, offset = b"", 0
        while True:
            chunk = handle.read(CHUNK)
            data = pending + chunk
            records, used = split_records(data, offset, final=not chunk)
            if batched:
                events += len(engine.feed_many(records))
            else:
                for record in records:
                    events += len(engine.feed(record))
            pending, offset = data[used:], offset + used
            if not chunk:
                break
    events += len(engine.flush())
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    label = "probe engine, `feed_many` per batch" if batched else "probe engine, `feed` per record"
    return Timing(label, wall, cpu, size, f"{events} events")


def run_grep(path: Path, patterns: Path, size: int, locale: str | None) -> Timing:
    env = dict(os.environ)
    if locale is not None:
        env["LC_ALL"] = locale
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall0 = time.perf_counter()
    result = subprocess.run(["grep", "-E", "-c", "-f", str(patterns), str(path)],
                            env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - wall0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if result.returncode not in (0, 1):
        raise SystemExit(f"grep failed: {result.stderr.strip()}")
    shown = locale or env.get("LC_ALL") or env.get("LANG") or "default"
    return Timing(f"`grep -E -c -f` (locale {shown})", wall, cpu, size, f"{result.stdout.strip()} lines matched")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=100.0, help="size of the generated log (default 100)")
    parser.add_argument("--keep", type=Path, help="write the log and patterns here and keep them")
    args = parser.parse_args()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="bench-probes-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log, patterns = workdir / "big.log", workdir / "patterns.txt"
    size = build_log(log, args.mb)
    total, translated, missing = export_patterns(patterns)
    print(f"log: {size / 1e6:.1f} MB of corpus logs repeated; patterns: {translated} of {total} probe regexes "
          f"have a POSIX ERE form (not: {', '.join(missing) or 'none'}), plus {len(TRACEBACK_ERE)} traceback markers\n")
    timings = [run_engine(log, size, batched=False), run_engine(log, size, batched=True),
               run_grep(log, patterns, size, None), run_grep(log, patterns, size, "C")]
    engine_best = max(timings[:2], key=lambda t: t.mb_s)
    print("| run | wall s | CPU s | MB/s (CPU) | vs grep | |")
    print("|---|---:|---:|---:|---:|---|")
    greps = timings[2:]
    for t in timings:
        ratio = " / ".join(f"{t.mb_s / g.mb_s:.1f}x" for g in greps) if t in timings[:2] else "-"
        print(f"| {t.label} | {t.wall:.2f} | {t.cpu:.2f} | {t.mb_s:.1f} | {ratio} | {t.note} |")
    print(f"\n(vs grep: engine speed over grep's, default locale / C locale; best engine run: {engine_best.label})")
    if args.keep is None:
        for path in (log, patterns):
            path.unlink(missing_ok=True)
        workdir.rmdir()
    return 0


if __name__ == "__main__":
    sys.exit(main())
