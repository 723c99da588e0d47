"""A copy of the tree with its per-line modules compiled by mypyc, for the benchmarks to compare with the pure one.

    .venv/bin/python tests/perf/build_compiled.py DIR [--modules M,...]

Exports the committed tree (``git archive HEAD``) to DIR and runs mypyc there on the modules that
hold a followed line's Python work (RESULTS.md §43 lists them, and those that would not compile
faithfully). mypyc writes each module's ``.so`` beside its source in DIR (the ``.so`` wins on
import) and one shared library at DIR's top; nothing is written into this checkout. Then, from DIR,
``python tests/perf/bench_scale.py --jobs '' --seconds 6 --tree THIS_CHECKOUT`` runs the compiled
daemon and the pure one alternating, and ``python DIR/tests/perf/bench_redraw_runs.py`` the
in-process loop compiled. Needs mypyc (a test dependency: mypy) and a C compiler.
"""

from __future__ import annotations

import argparse
import io
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# The pure, synchronous modules a followed line goes through (RESULTS.md §43). Left out: probes/_engine.py
# (its ``_CompiledProbe`` compiles its regexes on first use through ``__getattr__``, which a native class
# never calls: compiled, it raised AttributeError) and probes/_identity.py (a native ``float`` attribute
# keeps a whole count as a float, where the pure class keeps the int it was given).
MODULES = (
    "supervisor/core/records.py",
    "supervisor/core/progress.py",
    "supervisor/probes/_scan.py",
    "supervisor/probes/_prefix.py",
    "supervisor/probes/_fields.py",
    "supervisor/watchdog/_facts.py",
    "supervisor/watchdog/_progress.py",
    "supervisor/watchdog/_judge.py",
    "supervisor/watchdog/_redraws.py",
    "supervisor/watchdog/_rules.py",
    "supervisor/jobs/milestones.py",
    "supervisor/jobs/redraw_runs.py",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dir", type=Path, help="where the compiled copy goes (emptied first)")
    parser.add_argument("--modules", default=",".join(MODULES), help="the modules to compile, comma-separated paths")
    args = parser.parse_args()
    out = args.dir.resolve()
    if out == ROOT or ROOT in out.parents:
        parser.error("DIR must be outside this checkout: a .so there would shadow the source in tests")
    mypyc = Path(sys.executable).with_name("mypyc")
    if not mypyc.exists():
        print(f"no mypyc beside {sys.executable}: install mypy into that environment", file=sys.stderr)
        return 69
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", "HEAD"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")
    modules = [m for m in args.modules.split(",") if m]
    start = time.monotonic()
    built = subprocess.run([str(mypyc), *modules], cwd=out, capture_output=True, text=True)
    took = time.monotonic() - start
    if built.returncode != 0:
        print(built.stdout[-4000:] + built.stderr[-4000:], file=sys.stderr)
        print(f"mypyc failed after {took:.0f} s (exit {built.returncode})", file=sys.stderr)
        return 1
    compiled = sorted(str(p.relative_to(out)) for p in (out / "supervisor").rglob("*.so"))
    print(f"{len(compiled)} of {len(modules)} modules compiled into {out} in {took:.0f} s wall")
    for path in compiled:
        print(f"  {path}")
    return 0 if len(compiled) == len(modules) else 1


if __name__ == "__main__":
    sys.exit(main())
