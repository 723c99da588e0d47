"""The score of a folder of labelled logs (its labels.toml, as the corpus's): per field and per log, a log
being read right when every field agrees with its labels.  tests/test_probes_heldout.py holds the
held-out logs to a floor with it; run by hand it prints the table:

    PYTHONPATH=$PWD .venv/bin/python tests/probe_score.py tests/data/heldout-logs
"""

from __future__ import annotations

import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_probes_corpus import FIELDS

from supervisor.probes import ReplayReport, replay_file


@dataclass
class Scored:
    file: str
    misses: list[str]  # the fields read wrong
    report: ReplayReport

    @property
    def right(self) -> bool:
        return not self.misses


def labels(folder: Path) -> list[dict[str, Any]]:
    return list(tomllib.loads((folder / "labels.toml").read_text())["log"])


def score(folder: Path) -> list[Scored]:
    out = []
    for label in labels(folder):
        report = replay_file(folder / label["file"])
        misses = [name for name, check in FIELDS.items()
                  if (name != "shards" or "shards_total" in label) and not check(label, report)]
        out.append(Scored(label["file"], misses, report))
    return out


def main(folder: str) -> None:
    scored = score(Path(folder))
    for s in scored:
        f = s.report.failure
        print(f"{'ok  ' if s.right else 'MISS'} {s.file}: {', '.join(s.misses) or '-'} | outcome={s.report.outcome.value} "
              f"phase={s.report.last_phase.value if s.report.last_phase else None} "
              f"failure={f.kind.value if f else None} line={f.line[:100] if f else ''!r}")
    right = sum(s.right for s in scored)
    print(f"read right: {right}/{len(scored)} ({100 * right / len(scored):.0f}%)")
    for name in FIELDS:
        print(f"  {name}: {sum(name not in s.misses for s in scored)}/{len(scored)}")


if __name__ == "__main__":
    main(sys.argv[1])
