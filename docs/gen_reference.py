"""Write the documentation pages made from the code, so that they cannot drift from it:

    reference/cli.md         every verb and flag (the argparse parser)
    reference/spec.md        every job spec field, its type, default and range (the pydantic models)
    reference/config.md      the daemon's settings and the SUPERVISE_* environment variables
    reference/api.md         the HTTP API (the OpenAPI document), and reference/openapi.json itself
    reference/exit-codes.md  the exit codes and the error table (supervisor/core/errors.py)
    reference/events.md      event kinds, phases, verdicts, states, alert kinds
    reference/metrics.md     every Prometheus metric
    reference/job-programs.md  jobs/README.md, the EAGLE-3 job programs (its links made site links or paths)
    results/benchmarks.md    tests/perf/RESULTS.md, its links made repository paths

Run it after changing any of those, from the repository's root:

    python docs/gen_reference.py            # writes into docs/
    python docs/gen_reference.py --out DIR  # writes into DIR instead (tests/test_docs.py compares)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

DOCS = Path(__file__).resolve().parent
sys.path[:0] = [str(DOCS.parent), str(DOCS)]  # the package, and refgen beside this file

from refgen import api, cli, config, metrics, results, spec, tables  # noqa: E402

PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli.render,
    "reference/spec.md": spec.render,
    "reference/config.md": config.render,
    "reference/api.md": api.render,
    "reference/openapi.json": api.openapi_json,
    "reference/exit-codes.md": tables.exit_codes,
    "reference/events.md": tables.events,
    "reference/metrics.md": metrics.render,
    "reference/job-programs.md": results.job_programs,
    "results/benchmarks.md": results.benchmarks,
}


def generate() -> dict[str, str]:
    """Each generated page's path (relative to docs/) and text."""
    return {path: render() for path, render in PAGES.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the documentation pages made from the code.")
    parser.add_argument("--out", type=Path, default=DOCS, help="the docs directory to write into (default: docs/)")
    args = parser.parse_args(argv)
    for path, text in generate().items():
        target = args.out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    print(f"wrote {len(PAGES)} pages into {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
