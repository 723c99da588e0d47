"""The progress sieve: which progress lines of an attempt are stored (supervisor/jobs/milestones.py)."""

from __future__ import annotations

from supervisor.core.events import Event, EventKind
from supervisor.jobs.milestones import ProgressMilestones


def _bar(done: int, total: int | None = None, offset: int = 0, desc: str | None = None,
         probe: str = "tqdm.bar", **fields: object) -> Event:
    data: dict[str, object] = {"done": done, **fields}
    if total is not None:
        data["total"] = total
    if desc is not None:
        data["desc"] = desc
    return Event(job="j", attempt=1, kind=EventKind.PROGRESS, message=f"{done}", probe=probe,
                 offset=offset, data=data)


def _kept(sieve: ProgressMilestones, events: list[Event], now: float = 0.0) -> list[int]:
    return [e.data["done"] for e in sieve.sieve(events, now)]


def test_a_bar_with_a_total_keeps_its_first_each_percent_and_its_last() -> None:
    sieve = ProgressMilestones()
    kept = _kept(sieve, [_bar(i, 20_000, offset=i) for i in range(20_001)])
    assert kept[0] == 0 and kept[-1] == 20_000
    assert len(kept) == 101  # 0 and each whole percent, 1% .. 100%
    assert kept[1] == 200 and kept[50] == 10_000
    assert sieve.to_save() == ([], [])  # the bar ended on a milestone


def test_a_small_bar_keeps_every_step() -> None:
    assert _kept(ProgressMilestones(), [_bar(i, 8) for i in range(9)]) == list(range(9))


def test_the_same_step_drawn_again_is_not_kept_twice() -> None:
    sieve = ProgressMilestones()
    assert _kept(sieve, [_bar(0, 4), _bar(4, 4), _bar(4, 4)]) == [0, 4]


def test_a_bar_without_a_total_keeps_one_line_per_interval() -> None:
    sieve = ProgressMilestones(interval_s=30)
    kept = [e.data["done"] for t in range(121) if (e := _bar(t)) and sieve.keep(e, float(t))]
    assert kept == [0, 30, 60, 90, 120]


def _store(sieve: ProgressMilestones, next_id: list[int]) -> tuple[list[int], list[int]]:
    """What a write would store and delete; ids assigned as the store would."""
    latest, replaced = sieve.to_save()
    for event in latest:
        next_id[0] += 1
        event.id = next_id[0]
    sieve.saved()
    return [e.data["done"] for e in latest], replaced


def test_each_bars_latest_line_is_stored_in_place_of_the_one_before() -> None:
    sieve, ids = ProgressMilestones(), [100]
    assert _kept(sieve, [_bar(i, 1000, offset=i) for i in range(15)]) == [0, 10]
    assert _store(sieve, ids) == ([14], [])  # row 101 stands for the bar's end
    assert _store(sieve, ids) == ([], [])  # nothing new: nothing written
    assert _kept(sieve, [_bar(14, 1000, offset=99)]) == []  # the same step drawn again
    assert _store(sieve, ids) == ([], [])
    assert _kept(sieve, [_bar(15, 1000, offset=100), _bar(16, 1000, offset=101)]) == []
    assert _store(sieve, ids) == ([16], [101])  # 16 replaces 14
    assert _kept(sieve, [_bar(20, 1000, offset=102)]) == [20]  # a milestone replaces it too
    assert _store(sieve, ids) == ([], [102])


def test_a_refused_write_is_asked_again_whole() -> None:
    sieve, ids = ProgressMilestones(), [0]
    _kept(sieve, [_bar(i, 1000) for i in range(3)])
    _store(sieve, ids)
    _kept(sieve, [_bar(5, 1000)])
    first = sieve.to_save()  # the store refused this write: saved() is not called
    assert [e.data["done"] for e in first[0]] == [5] and first[1] == [1]
    _kept(sieve, [_bar(6, 1000)])
    latest, replaced = sieve.to_save()
    assert [e.data["done"] for e in latest] == [6] and replaced == [1]


def test_bars_are_kept_apart_by_description_and_process() -> None:
    sieve = ProgressMilestones()
    events = [_bar(0, 1000, desc="a"), _bar(0, 1000, desc="b"), _bar(1, 1000, desc="a"),
              _bar(0, 1000, desc="a", rank=1), _bar(5, 1000, desc="b")]
    assert [sieve.keep(e, 0.0) for e in events] == [True, True, False, True, False]
    assert sorted(e.data["done"] for e in sieve.to_save()[0]) == [1, 5]


def test_a_bar_drawn_again_from_its_start_is_a_new_bar() -> None:
    sieve = ProgressMilestones()
    assert _kept(sieve, [_bar(0, 1000), _bar(3, 1000), _bar(0, 1000), _bar(1, 1000)]) == [0, 0]


def test_other_events_and_uncounted_progress_are_always_kept() -> None:
    sieve = ProgressMilestones()
    phase = Event(job="j", attempt=1, kind=EventKind.PHASE, message="p")
    odd = Event(job="j", attempt=1, kind=EventKind.PROGRESS, message="?", data={"eta": "1s"})
    assert sieve.sieve([phase, odd, phase, odd], 0.0) == [phase, odd, phase, odd]


def test_the_store_replaces_a_bars_latest_row_in_the_same_write(tmp_path) -> None:
    from test_store import attempt

    from supervisor.store.database import Store

    store = Store(tmp_path / "s.db")
    store.upsert_job("j", {}, "running")
    store.add_attempt(attempt())
    phase = Event(job="j", attempt=1, kind=EventKind.PHASE, message="p")
    _, latest, phase_row = store.record_events([_bar(0, 1000, offset=0), _bar(5, 1000, offset=5), phase], offset=5)
    assert latest.id is not None and phase_row.id is not None
    store.record_events([_bar(6, 1000, offset=6)], offset=6, replaced=[latest.id, phase_row.id])
    # The progress row goes; an id that is not a progress row's is never deleted.
    assert [(e.kind, e.data.get("done")) for e in store.events("j")] == [("progress", 0), ("phase", None),
                                                                       ("progress", 6)]
    assert store.attempt("j", 1).log_offset == 6
    store.close()


def test_a_hundred_thousand_one_step_bars_hold_a_bounded_state_and_past_the_cap_bounded_rows() -> None:
    """tqdm over files: each file its own one-step bar.  The sieve holds the bars it may still
    continue, not every bar it saw; past the cap, the stand-ins of the newest bars only."""
    sieve = ProgressMilestones()
    row = 0
    stored: set[int] = set()
    for n in range(100_000):
        sieve.latest_only = n >= 5_000  # the attempt's event cap reached at the 5,000th bar
        for done in (0, 1):
            sieve.keep(_bar(done, 1, offset=2 * n + done, desc="files"), float(n))
        latest, replaced = sieve.to_save()
        for event in latest:
            row += 1
            event.id = row
            stored.add(row)
        stored -= set(replaced)
        sieve.saved()
        assert sieve.bars_held <= 200, (n, sieve.bars_held)
    assert len(stored) <= 64  # past the cap: the newest bars' stand-ins, each in place of the oldest's
    assert max(stored) == row  # the last bar's end is among them
