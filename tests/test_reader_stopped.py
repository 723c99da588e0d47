"""A reader stopped (a daemon stopping, an attempt handed over) while its step is being matched:
what it stores must never put the log offset past events it has not kept.  A real daemon in-process,
a real job, a real SQLite file; the store refuses writes for a while (as a full disk does) and the
matcher is held after it has matched a step, so the stop falls in that window every time."""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from in_process import serving

from supervisor.core.config import DaemonSettings, Paths
from supervisor.core.errors import StoreError
from supervisor.core.events import Record
from supervisor.daemon.service import Service
from supervisor.jobs.matching import Matched, Matcher
from supervisor.jobs.pending import PendingWrites
from supervisor.store.database import Store

LOSSES = 3000


def test_a_reader_stopped_while_its_step_is_matched_stores_nothing_past_its_events(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The matcher's thread has matched a step (the engine has gone past its records) when the
    reader is cancelled: those events are not kept yet.  Earlier events wait for a store that
    refused them; the stopped reader stores them with the offset from before the step, so every
    loss line before the stored offset has its event (none skipped by the next daemon)."""
    home = tmp_path / "h"
    home.mkdir()
    script = home / "losses.py"
    script.write_text(textwrap.dedent(f"""\
        import sys, time
        for i in range({LOSSES}):
            sys.stdout.write(f"{{{{'loss': {{i}}.0, 'learning_rate': 1e-05, 'epoch': 0.1}}}}\\n")
            if i % 100 == 99:
                sys.stdout.flush()
                time.sleep(0.02)
        sys.stdout.flush()
        time.sleep(30)
        """))
    spec = home / "losses.toml"
    spec.write_text(f'name = "losses"\ncommand = ["{{python}}", "{script}"]\nprobes = ["transformers"]\n'
                    '[restart]\nmax_attempts = 1\n')
    held = asyncio.Event()
    refusing = True
    real_now, real_feed = PendingWrites.now, Matcher.feed
    fed = 0

    def now(self: PendingWrites, write: Any, *args: Any, **kwargs: Any) -> Any:
        if refusing and self.job == "losses":
            raise StoreError("refused (this test)")
        return real_now(self, write, *args, **kwargs)

    async def feed(self: Matcher, records: Sequence[Record]) -> Matched:
        nonlocal fed
        matched = await real_feed(self, records)
        fed += 1
        if fed == 3:  # two steps' events wait for the store; the third step is matched, not yet taken
            held.set()
            await asyncio.Event().wait()
        return matched

    monkeypatch.setattr(PendingWrites, "now", now)
    monkeypatch.setattr(Matcher, "feed", feed)

    async def run() -> None:
        nonlocal refusing
        async with serving(Service(Paths(home), DaemonSettings())) as client:
            await asyncio.to_thread(client.start, str(spec), {})
            await asyncio.wait_for(held.wait(), 60)
            refusing = False  # the store takes writes again: what the stopped reader stores is kept

    asyncio.run(run())
    store = Store(Paths(home).db)
    row = store.latest_attempt("losses")
    assert row is not None and row.log_offset > 0
    losses = store.events("losses", kinds=["metric"], limit=LOSSES + 1)
    log = Path(row.log_path).read_bytes()[:row.log_offset]
    assert len(losses) == log.count(b"'loss'") > 0  # each line before the offset: its event stored
