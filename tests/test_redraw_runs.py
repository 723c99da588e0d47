"""Redraws between milestones taken from their counts (supervisor/jobs/redraw_runs.py): no event
made of them, the watchdog handed each run as one summary (``Watchdog.redrawn``), an info line
that changes nothing not fed again (``Watchdog.unchanged_by``).  Nothing judged or stored may
differ from feeding every line one by one: a differential test over random logs compares the
watchdog's state, verdicts, stall bounds and paces, and what is stored, both ways."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, fields
from typing import Any

import pytest

from supervisor.core.events import Event, EventKind, Failure, FailureKind, Phase, ProbeEvent, ProbeKind
from supervisor.core.payloads import ProbeFields, jsonable
from supervisor.jobs.event_cap import EventCap
from supervisor.jobs.milestones import ProgressMilestones
from supervisor.jobs.redraw_runs import RedrawRuns
from supervisor.spec.tables import HealthSpec
from supervisor.watchdog import Watchdog


def _event(pe: ProbeEvent, ts: float) -> Event:
    return Event(job="j", attempt=1, kind=EventKind(pe.kind.value), message=pe.line, ts=ts, probe=pe.probe,
                 phase=pe.phase, offset=pe.offset, data=ProbeFields(jsonable(pe.fields)).to_json(), failure=pe.failure)


@dataclass
class Side:
    """One attempt's watchdog, stored milestones and event cap, fed one way."""

    watchdog: Watchdog
    sieve: ProgressMilestones = field(default_factory=ProgressMilestones)
    cap: EventCap = field(default_factory=lambda: EventCap(limit=40))
    stored: list[tuple[str, int | None, Any]] = field(default_factory=list)
    events_made: int = 0
    next_id: int = 0
    writes: list[Any] = field(default_factory=list)

    def keep(self, event: Event) -> None:
        self.sieve.latest_only = self.cap.reached
        if self.cap.admits(event, kept=self.sieve.keep(event, event.ts)):
            self.stored.append((event.kind.value, event.offset, event.data.get("done")))

    def judged(self, pe: ProbeEvent, at: float, ts: float) -> Event:
        event = _event(pe, ts)
        self.events_made += 1
        self.watchdog.observe(event, at)
        return event

    def one_by_one(self, read: list[ProbeEvent], at: float, ts: float) -> None:
        self.watchdog.output_seen(at)
        for pe in read:
            self.keep(self.judged(pe, at, ts))

    def summarised(self, read: list[ProbeEvent], at: float, ts: float) -> None:
        """As ``AttemptWatch._observe`` takes a read (no backlog, no alert reading each step)."""
        self.watchdog.output_seen(at)

        def refused(lines: list[ProbeEvent]) -> None:
            for pe in lines:
                self.judged(pe, at, ts)

        runs = RedrawRuns(self.watchdog, self.sieve, self.cap, job="j", attempt=1, generation=0, ts=ts, at=at,
                          feed=refused)
        for pe in read:
            if runs.take(pe):
                continue
            if pe.kind is ProbeKind.INFO and pe.failure is None and self.watchdog.unchanged_by(pe.probe, pe.phase,
                                                                                               pe.fields, at):
                if self.cap.reached:
                    self.cap.drop()
                    continue
                self.events_made += 1
                self.keep(_event(pe, ts))
                continue
            self.keep(self.judged(pe, at, ts))
        runs.close()

    def latest(self) -> tuple[list[tuple[int | None, Any, float]], list[int]]:
        latest, replaced = self.sieve.to_save()
        return [(e.offset, e.data.get("done"), e.ts) for e in latest], replaced

    def save(self) -> None:
        """A write: each bar's latest line stored as a row (ids as the store gives them)."""
        latest, replaced = self.sieve.to_save()
        for event in latest:
            event.id = self.next_id = self.next_id + 1
        self.writes.append(([(e.id, e.offset, e.ts) for e in latest], replaced))
        self.sieve.saved()


def _look(side: Side, at: float) -> dict[str, Any]:
    wd = side.watchdog
    state = wd.state(at)
    facts = wd._facts  # every fact folded (the log's tail aside: no records are fed here)
    return {"state": state, "facts": {f.name: getattr(facts, f.name) for f in fields(facts) if f.name != "tail"}, "paces": wd.paces(), "bounds": wd.stall_bounds(at),
            "checks": [wd.check(at + d) for d in (0.0, 5.0, 60.0, 900.0)], "stragglers": wd.stragglers(),
            "stored": list(side.stored), "latest": side.latest(), "writes": list(side.writes), "cap": (side.cap.stored, side.cap.dropped)}


class _Log:
    """Random probe events of a busy log: bars (some by several ranks, some taken back or with
    a phase, a loss or a serving field), access-log lines, heartbeats, phases and failures."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.offset = 0
        self.bars = {name: 0 for name in ("load", "train", "eval")}
        self.drawing = ("load", 0)  # the bar drawn lately (and its rank): most lines redraw it

    def _pe(self, kind: ProbeKind, probe: str, fields: dict[str, Any], phase: Phase | None = None,
            failure: Failure | None = None) -> ProbeEvent:
        self.offset += 80
        return ProbeEvent(kind, probe, self.offset, f"line {self.offset}", phase, failure, fields)

    def line(self) -> ProbeEvent:
        rng = self.rng
        roll = rng.random()
        if roll < 0.70:
            if rng.random() < 0.15:
                self.drawing = (rng.choice(["load", "load", "load", "train", "eval"]), rng.choice([0, 0, 1]))
            name, rank = self.drawing
            step = rng.choice([0, 1, 1, 1, 2, 7])
            if rng.random() < 0.01:
                step = -self.bars[name]  # drawn again from its start
            self.bars[name] = max(0, self.bars[name] + step)
            total = 400 if name != "eval" else 50
            fields: dict[str, Any] = {"done": min(self.bars[name], total), "total": total, "desc": name}
            if name == "train" and rng.random() < 0.8:  # two ranks: stragglers
                fields["rank"] = rank
            if rng.random() < 0.03:
                fields["loss"] = rng.choice([1.0, 2.0, float("nan")])
            if rng.random() < 0.02:
                fields["total"] = total + 1
            phase = Phase.WEIGHT_LOADING if name == "load" else Phase.RUNNING if rng.random() < 0.9 else None
            return self._pe(ProbeKind.PROGRESS, "tqdm.bar", fields, phase)
        if roll < 0.88:
            fields = {"serving": True, "status": rng.choice([200, 200, 200, 503])}
            return self._pe(ProbeKind.INFO, "uvicorn.access", fields, rng.choice([None, Phase.ENGINE_READY]))
        if roll < 0.92:
            return self._pe(ProbeKind.INFO, "x.wait", {"heartbeat": True, "paused": rng.random() < 0.5})
        if roll < 0.96:
            return self._pe(ProbeKind.PHASE, "x.phase", {}, rng.choice(list(Phase)[:8]))
        failure = Failure(FailureKind.OTHER, "boom", fingerprint="f", level=rng.choice(["WARNING", "ERROR"]))
        return self._pe(ProbeKind.FAILURE, "x.fail", {}, None, failure)


@pytest.mark.parametrize("seed", range(24))
def test_random_logs_judge_and_store_the_same_either_way(seed: int) -> None:
    rng = random.Random(seed)
    log = _Log(rng)
    health = HealthSpec()
    clock = [0.0]
    one = Side(Watchdog(health, clock=lambda: clock[0], started_at=0.0))
    two = Side(Watchdog(health, clock=lambda: clock[0], started_at=0.0))
    at = 0.0
    for _ in range(300):
        at += rng.choice([0.0005, 0.001, 0.002, 0.3, 4.0])
        clock[0] = at
        read = [log.line() for _ in range(rng.choice([1, 1, 2, 3, 6, 20]))]
        one.one_by_one(read, at, 1e9 + at)
        two.summarised(read, at, 1e9 + at)
        if rng.random() < 0.1:
            assert _look(one, at) == _look(two, at)
            one.save()
            two.save()
    assert _look(one, at) == _look(two, at)
    assert two.events_made < one.events_made


def _redraw(done: int, offset: int, total: int = 6000) -> ProbeEvent:
    return ProbeEvent(ProbeKind.PROGRESS, "transformers.shards", offset, f"Loading checkpoint shards: {done}/{total}",
                      Phase.WEIGHT_LOADING, None, {"done": done, "total": total})


def test_a_bar_redrawn_makes_events_of_its_milestones_only() -> None:
    clock = [0.0]
    side = Side(Watchdog(HealthSpec(), clock=lambda: clock[0], started_at=0.0), cap=EventCap())
    done = 0
    for read in range(3000):  # 6,000 redraws, two a read, 1 ms apart
        clock[0] = at = read * 0.002
        side.summarised([_redraw(done + 1, 100 * done), _redraw(done + 2, 100 * done + 50)], at, at)
        done += 2
    # The bar's first line and each whole percent are stored; no other line became an event.
    assert side.events_made == len(side.stored) == 101
    progress = side.watchdog.progress
    assert progress is not None and progress.done == 6000
    assert progress.rate == pytest.approx(0.001)  # one interval a read, over the read's two steps


def test_a_run_the_watchdog_cannot_take_whole_is_fed_line_by_line() -> None:
    """After a failure, a bar's line that names ``done`` enters it only once the bar has advanced
    (its second line): such a run is refused as a summary, and its lines are judged one by one."""
    wd = Watchdog(HealthSpec(), clock=lambda: 1.0, started_at=0.0)
    ref = Watchdog(HealthSpec(), clock=lambda: 1.0, started_at=0.0)
    sieve = ProgressMilestones()
    first = ProbeEvent(ProbeKind.PROGRESS, "b.bar", 0, "0/400", None, None, {"done": 0, "total": 400})
    before = [ProbeEvent(ProbeKind.PHASE, "x.phase", 0, "running", Phase.RUNNING, None, {}), first,
              ProbeEvent(ProbeKind.FAILURE, "x.fail", 10, "boom", None, Failure(FailureKind.OTHER, "boom"), {})]
    for watchdog in (wd, ref):
        for pe in before:
            watchdog.observe(_event(pe, 0.5), 0.5)
    assert sieve.keep(_event(first, 0.5), 0.5)  # the stored milestones know the bar: its next lines are none
    fed: list[ProbeEvent] = []
    runs = RedrawRuns(wd, sieve, EventCap(), job="j", attempt=1, generation=0, ts=1.0, at=1.0, feed=fed.extend)
    run = [ProbeEvent(ProbeKind.PROGRESS, "b.bar", 20 + i, f"{i}/400", Phase.DONE, None, {"done": i, "total": 400})
           for i in (1, 2)]
    assert all(runs.take(pe) for pe in run)
    runs.close()
    assert fed == run and wd.phase is Phase.RUNNING  # refused, nothing folded: the caller feeds them
    for pe in run:
        ref.observe(_event(pe, 1.0), 1.0)
        wd.observe(_event(pe, 1.0), 1.0)
    assert wd.state(1.0) == ref.state(1.0) and wd.phase is Phase.DONE


def test_an_info_line_that_changed_nothing_is_unchanged_across_reads_until_the_state_moves() -> None:
    wd = Watchdog(HealthSpec(), clock=lambda: 0.0, started_at=0.0)
    access = ProbeEvent(ProbeKind.INFO, "uvicorn.access", 0, "GET / 200", None, None, {"serving": True, "status": 200})
    wd.output_seen(1.0)
    wd.observe(_event(access, 1.0), 1.0)
    wd.output_seen(1.0)
    assert not wd.observe(_event(access, 1.0), 1.0)  # changed nothing
    wd.output_seen(2.0)  # a later read
    assert wd.unchanged_by(access.probe, None, access.fields, 2.0)
    assert not wd.unchanged_by(access.probe, None, {"serving": True, "status": 201}, 2.0)  # another line
    assert not wd.unchanged_by(access.probe, None, access.fields, 2.5)  # not the latest output's time
    wait = ProbeEvent(ProbeKind.INFO, "x.wait", 5, "waiting", None, None, {"heartbeat": True, "paused": True})
    wd.output_seen(3.0, heartbeats_only=True)
    wd.observe(_event(wait, 3.0), 3.0)  # a wait began: the next line ends it
    wd.output_seen(4.0)
    assert not wd.unchanged_by(access.probe, None, access.fields, 4.0)
    assert wd.observe(_event(access, 4.0), 4.0) is False and wd.paused is None
    assert wd.unchanged_by(access.probe, None, access.fields, 4.0)
    wd.observe(_event(ProbeEvent(ProbeKind.PHASE, "x.phase", 9, "ready", Phase.ENGINE_READY, None, {}), 4.0), 4.0)
    assert not wd.unchanged_by(access.probe, None, access.fields, 4.0)  # the phase moved
