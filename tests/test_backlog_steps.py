"""A backlog is read a short step at a time, and attempts' chunks are matched in turn, so that the
loop answers between steps.

A log read in reads of up to a MiB had each read's records matched, judged and stored in one go on
the event loop: eight jobs with a backlog held it for seconds (`status` p99 8 s in the soak).  The
daemon here runs in this process (its real store, its real local host, a real child writing its
log), so that the records each step takes can be counted where they are counted for the metrics.
"""

from __future__ import annotations

import asyncio
import textwrap
import threading
import time
from pathlib import Path

from in_process import serving

from supervisor.core.config import DaemonSettings, Paths
from supervisor.core.events import AttemptState, Record
from supervisor.daemon.service import Service
from supervisor.jobs import matching
from supervisor.jobs.runner._watching import _RECORDS_PER_STEP
from supervisor.probes import load_packs

LINES = 20_000  # ~1.3 MB: more than one read of the follower's, tens of steps


def test_a_backlog_is_taken_in_bounded_steps_and_wholly_read(tmp_path: Path) -> None:
    home = tmp_path / "h"
    home.mkdir()
    script = home / "burst.py"
    # The whole log at once, then a wait: the daemon finds it as one backlog.
    script.write_text(textwrap.dedent(f"""\
        import sys, time
        sys.stdout.write("".join(f"worker line {{i}} of a burst written at once\\n" for i in range({LINES})))
        sys.stdout.flush()
        time.sleep(1.5)
        """))
    spec = home / "burst.toml"
    spec.write_text(f'name = "burst"\ncommand = ["{{python}}", "{script}"]\nprobes = ["python"]\n')
    steps: list[int] = []

    async def run() -> tuple[AttemptState, int, int]:
        service = Service(Paths(home), DaemonSettings())
        service.metrics.records_seen = lambda job, n: steps.append(n)  # type: ignore[method-assign]
        async with serving(service) as client:
            await asyncio.to_thread(client.start, str(spec), {})
            for _ in range(1500):
                row = service.store.latest_attempt("burst")
                if row is not None and not row.state.active:
                    return row.state, row.log_offset, Path(row.log_path).stat().st_size
                await asyncio.sleep(0.02)
            raise AssertionError("the attempt did not end")

    state, offset, size = asyncio.run(run())
    assert state is AttemptState.ENDED
    assert sum(steps) == LINES  # every line read, none twice
    assert max(steps) <= _RECORDS_PER_STEP < LINES // 10  # never a whole read's records in one step
    assert offset == size  # and the offset stored with the last step is the log's end


def test_attempts_match_one_chunk_at_a_time() -> None:
    """Eight matcher threads at once each took the GIL in turn with the loop, which then waited
    behind all of them at every system call; chunks of different attempts now take turns."""
    inside = 0
    most = 0
    guard = threading.Lock()
    real = matching.ProbeEngine.feed_many

    def feed_many(self: matching.ProbeEngine, records: list[Record]) -> list[object]:
        nonlocal inside, most
        with guard:
            inside += 1
            most = max(most, inside)
        time.sleep(0.02)  # long enough for the others' chunks to overlap with it, if they may
        try:
            return real(self, records)  # type: ignore[return-value]
        finally:
            with guard:
                inside -= 1

    packs = load_packs(["python"])

    async def run() -> list[int]:
        matchers = [matching.Matcher(packs, 0, f"m{i}") for i in range(4)]
        try:
            batches = [[Record(f"line {j}", j * 8, j * 8 + 8) for j in range(5)] for _ in range(3)]
            counts = await asyncio.gather(*(_feed_all(m, batches) for m in matchers))
        finally:
            for m in matchers:
                m.close()
        return counts

    matching.ProbeEngine.feed_many = feed_many  # type: ignore[method-assign,assignment]
    try:
        counts = asyncio.run(run())
    finally:
        matching.ProbeEngine.feed_many = real  # type: ignore[method-assign]
    assert counts == [3, 3, 3, 3] and most == 1


async def _feed_all(matcher: matching.Matcher, batches: list[list[Record]]) -> int:
    fed = 0
    for batch in batches:
        await matcher.feed(batch)
        fed += 1
    return fed


def test_a_bars_pending_line_is_saved_on_time_and_retried_at_the_retry_pace_while_the_store_refuses() -> None:
    from supervisor.jobs.runner._watching import _OFFSET_SAVE_INTERVAL_S, _UNSAVED_RETRY_S, quiet_timeout

    # Nothing open, nothing pending: wait for the next line however long it takes.
    assert quiet_timeout(None, latest_pending=False, since_save=9.0, refused=False, unsaved=False) is None
    # A bar's latest line waits: woken when the second between saves is up, or at once if it is.
    assert quiet_timeout(None, latest_pending=True, since_save=0.25, refused=False, unsaved=False) == \
        _OFFSET_SAVE_INTERVAL_S - 0.25
    assert quiet_timeout(None, latest_pending=True, since_save=5.0, refused=False, unsaved=False) == 0.0
    # ... but not at once, again and again, while the store refuses it (a held lock, a full disk):
    # that spun the loop for as long as it lasted.
    assert quiet_timeout(None, latest_pending=True, since_save=5.0, refused=True, unsaved=False) == _UNSAVED_RETRY_S
    # Something open (a traceback, a redraw) due sooner still wakes it sooner.
    assert quiet_timeout(0.2, latest_pending=True, since_save=5.0, refused=True, unsaved=True) == 0.2
