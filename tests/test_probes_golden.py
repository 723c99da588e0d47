"""The probe engine reads every corpus log exactly as the stored snapshot says: the same
events (kinds, offsets, lines, fields, failures), the same resume points after every chunk,
the same events when resumed, and the same offline report (see tests/probe_golden.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from probe_golden import GOLDEN, corpus_logs, snapshot

STORED: dict[str, dict[str, Any]] = {
    entry["log"]: entry for entry in map(json.loads, GOLDEN.read_text(encoding="utf-8").splitlines())
}


def test_every_corpus_log_has_a_snapshot() -> None:
    assert sorted(STORED) == sorted(str(p.relative_to(p.parents[1])) for p in corpus_logs())


@pytest.mark.parametrize("path", corpus_logs(), ids=lambda p: p.name)
def test_engine_reads_the_log_as_stored(path: Path) -> None:
    now = json.loads(json.dumps(snapshot(path), sort_keys=True))  # tuples as lists, as stored
    stored = STORED[now["log"]]
    for key in ("events", "points", "one_by_one_same", "resumed", "report"):
        assert now[key] == stored[key], f"{now['log']}: {key} differs from the stored snapshot"
