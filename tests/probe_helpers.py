"""Feeding text through the probe engine with the built-in packs, as the tests of the packs do."""

from __future__ import annotations

import pytest

from supervisor.core.events import ProbeEvent
from supervisor.core.records import split_records
from supervisor.probes import ProbeEngine, _replay, load_packs
from supervisor.probes._replay import ReplayReport, build_report

PACKS = load_packs()


def events_of(text: str | bytes | list[str], packs: list | None = None) -> list[ProbeEvent]:
    """Every event the engine reads from ``text`` (a whole log, or its lines), flushed at the end."""
    if isinstance(text, list):
        text = "\n".join(text) + "\n"
    data = text.encode() if isinstance(text, str) else text
    records, used = split_records(data, 0, final=True)
    assert used == len(data)
    engine = ProbeEngine(PACKS if packs is None else packs)
    return engine.feed_many(records) + engine.flush()


def report_of(lines: list[str]) -> ReplayReport:
    """The offline report of ``lines``, as `supervise probe` would give it."""
    return build_report(events_of(lines))


def count_replay_splits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many records each ``split_records`` call of the offline replay makes from now on."""
    made: list[int] = []

    def counting(data: bytes, base: int, final: bool = False) -> tuple[list, int]:
        out = split_records(data, base, final)
        made.append(len(out[0]))
        return out

    monkeypatch.setattr(_replay, "split_records", counting)
    return made
