"""The rules and their bounds: each is a deadline from which it is violated unless an event
changes the facts, with the verdict it gives and how it explains itself.

Rules are functions of the job's ``HealthSpec`` and the folded ``Facts``: stuck progress
(k x the median interval, at least the phase's floor), a phase that never shows progress or
outlives its deadline, silence, a hang after a failure, start-up phases with only
"still waiting" lines; and, each in its own module, a serving engine that does no work
(``_serving``) and a diverging loss (``_divergence``).
"""

from __future__ import annotations

from supervisor.core.events import BoundKind, Failure, FailureKind, Phase, Verdict
from supervisor.core.payloads import SlowStep
from supervisor.spec.tables import HealthSpec
from supervisor.watchdog._conditions import Condition, Judgement, fine_duration, format_duration
from supervisor.watchdog._divergence import diverged
from supervisor.watchdog._evidence import (
    BarAt,
    Blamed,
    EngineDead,
    Evidence,
    Healthy,
    HungAfterFailure,
    NoFirstProgress,
    PastDeadline,
    Silent,
    Stalled,
    StillWaiting,
    Unpinged,
)
from supervisor.watchdog._facts import Facts
from supervisor.watchdog._idle import idle
from supervisor.watchdog._pace import OWN_WINDOW, SLOW_FACTOR, BarPace, BoundSource
from supervisor.watchdog._progress import Track
from supervisor.watchdog._serving import hung_engine

_TRACEBACK_TAIL_LINES = 15


def conditions(health: HealthSpec, facts: Facts) -> list[Condition]:
    """Every rule that applies to the facts as they stand."""
    watched = [t for t in facts.tracks.values() if t.watched]
    found = [_stall(health, facts, t) for t in watched]
    found.extend(c for t in watched if (c := _slow(health, facts, t)) is not None)
    for rule in (_first_progress, _deadline, _silence, _no_ping, _hang_after_failure, _waiting, _engine_dead):
        found.extend(rule(health, facts))
    found.extend(hung_engine(health, facts.engine))
    found.extend(diverged(health, facts.loss))
    found.extend(idle(health, facts.gpu, _still_since(facts, facts.moved_at), facts.engine.without_work))
    return found


def healthy(facts: Facts, at: float) -> Judgement:
    progress = facts.progress
    where = f"phase {facts.phase_name}"
    bar = paused_s = paused = None
    if progress is not None:
        total = progress.total if progress.total is not None else "?"
        where += f", {label(progress.probe)} {progress.done}/{total}"
        bar = BarAt(progress.probe, progress.done, progress.total)
    if facts.paused is not None:
        where += f", paused for {format_duration(at - facts.paused.since)}: {facts.paused.line}"
        paused_s, paused = round(at - facts.paused.since, 3), facts.paused.line
    return Judgement(Verdict.HEALTHY, where, Healthy(facts.phase_name, round(at - facts.last_output_at, 3), bar,
                                                     paused_s, paused))


def failure_evidence(failure: Failure, failures_seen: int) -> Blamed:
    """The failure a verdict is blamed on, as evidence."""
    tail = "\n".join((failure.traceback or "").splitlines()[-_TRACEBACK_TAIL_LINES:])
    return Blamed(failure.kind, failure.line, failure.fingerprint, tail, failures_seen)


def _stall(health: HealthSpec, facts: Facts, track: Track) -> Condition:
    bound, how, source = _stall_bound(health, facts.phase, track, facts.history.get(track.key))
    since = _still_since(facts, track.last_advance_at)
    # The deadline is computed once, here, and compared with >= everywhere, so the
    # daemon waking exactly at next_check_at() sees the violation (no float slack).
    deadline = since + bound
    paused = facts.paused

    def describe(at: float) -> tuple[str, Evidence]:
        stalled = at - since
        median = track.median_interval()
        if paused is not None and since == paused.latest > track.last_advance_at:  # its "paused" lines stopped
            reason = (f"{_where(track)}, paused and no word of it for {format_duration(stalled)} ({how}); "
                      f"last: {paused.line}")
        else:
            reason = f"{_where(track)}, no progress for {format_duration(stalled)} ({how})"
        evidence = Stalled(
            probe=track.probe,
            bar=track.bar,
            done=track.done,
            total=track.total,
            stalled_s=round(stalled, 3),
            median_interval_s=None if median is None else round(median, 3),
            bound_s=round(bound, 3),
            bound_source=str(source),
            phase=facts.phase_name,
        )
        return reason, evidence

    return Condition(deadline, Verdict.STALLED, describe, since, source, bar=track)


def _still_since(facts: Facts, moved_at: float) -> float:
    """Where a clock of standing still starts: the last move, or, while the program says it waits by design
    (``paused`` heartbeats), its latest such line (a wait is judged only once those lines stop), or the end of
    such a wait (the time waited is not the bar's)."""
    since = moved_at if facts.wait_ended_at is None else max(moved_at, facts.wait_ended_at)
    return since if facts.paused is None else max(since, facts.paused.latest)


def _where(track: Track) -> str:
    where = f"{label(track.probe)} {track.done}/{track.total if track.total is not None else '?'}"
    if track.bar and track.bar != track.probe:
        where += f" [{track.bar}]"  # which of the probe's bars (rank, description)
    return where


def _stall_bound(health: HealthSpec, phase: Phase | None, track: Track,
                 history: BarPace | None) -> tuple[float, str, BoundSource]:
    """The bound, how it reads in a reason, and its source (``history (…)``, ``this run``,
    ``default floor``, ``learned minimum``, ``first progress``).

    The bound is the largest of what applies, so that nothing learned can kill a job that is
    moving: the floor (``first_progress_s`` before the bar's first interval, when set), the
    history's bound (earlier attempts loosen it: a bar known to take 90 s a step is not a stall
    at 60 s), and ``stall_k`` x this attempt's own median interval.  History replaces the floor
    only where the spec asks for it (``learned_min_s``), never below that minimum, and only once
    this attempt has measured an interval of its own: its first step (a cold cache, another
    disk) is judged by the floor, and a slower run's own pace keeps raising its bound."""
    k = health.stall_k
    median = track.median_interval()
    terms: list[tuple[float, str, BoundSource]] = []
    first = health.first_progress_s.get(phase) if phase is not None and median is None else None
    if first is not None:
        terms.append((first, f"bound {first:.1f}s: first advance expected within {format_duration(first)}",
                      BoundSource(BoundKind.FIRST_PROGRESS)))
    elif history is not None and median is not None and health.learned_min_s is not None:
        least = health.learned_min_s
        terms.append((least, f"bound {least:.1f}s = learned_min_s", BoundSource(BoundKind.LEARNED_MIN)))
    else:
        floor = health.stall_floor(phase)
        said = "no interval measured yet" if median is None else f"{k:g} x median {median:.2f} s/it is less"
        setting = health.stall_floor_setting(phase)
        terms.append((floor, f"bound {floor:.1f}s = {setting or 'stall floor'}; {said}",
                      BoundSource(BoundKind.DEFAULT_FLOOR, setting=setting)))
    if history is not None:
        base = history.bound(k)
        terms.append((base, f"bound {base:.1f}s from {history.source()}", history.source()))
    if median is not None:
        own = k * median
        terms.append((own, f"bound {own:.1f}s = {k:g} x median {median:.1f} s/it", BoundSource(BoundKind.THIS_RUN)))
    # Ties go to the earliest term: the floor the user set reads better than an equal product.
    return max(terms, key=lambda term: term[0])


def _slow(health: HealthSpec, facts: Facts, track: Track) -> Condition | None:
    # A step well over what earlier attempts took, reported before it becomes a stall: a slow
    # disk, a straggler rank.  Without history there is nothing to be slow against.
    history = facts.history.get(track.key)
    if history is None:
        return None
    after = history.slow_after()
    median = track.median_interval()
    if median is not None and track.measured >= OWN_WINDOW:
        # A run slower all along than the last ones (another disk) is not slow at every step.
        after = max(after, SLOW_FACTOR * median)
    after = max(after, health.slow_floor_s)  # a step of a fast bar is slow only once it has lasted a while
    stall, _, _ = _stall_bound(health, facts.phase, track, history)
    if after >= stall:
        return None
    since = _still_since(facts, track.last_advance_at)

    def describe(at: float) -> tuple[str, Evidence]:
        taken = at - since
        reason = (f"{_where(track)}: this step has taken {format_duration(taken)}, over "
                  f"{format_duration(after)} ({history.source()}: 95th percentile {fine_duration(history.high)}); "
                  f"a stall at {format_duration(stall)}")
        step = SlowStep(probe=track.probe, bar=track.bar, done=track.done, total=track.total, step_s=round(taken, 3),
                        slow_after_s=round(after, 3), history_p95_s=round(history.high, 3),
                        stall_bound_s=round(stall, 3), bound_source=str(history.source()), phase=facts.phase_name)
        return reason, step

    return Condition(since + after, Verdict.STALLED, describe, since, history.source(), advisory=True, bar=track)


def _first_progress(health: HealthSpec, facts: Facts) -> list[Condition]:
    # A phase expected to show progress that shows none at all (the bar never drew).
    if facts.phase is None or facts.phase_has_progress:
        return []
    limit = health.first_progress_s.get(facts.phase)
    if limit is None:
        return []
    entered = facts.phase_entered_at
    phase = facts.phase_name

    def describe(at: float) -> tuple[str, Evidence]:
        waited = at - entered
        reason = (
            f"phase {phase}: no progress shown for {format_duration(waited)} "
            f"(first progress expected within {format_duration(limit)})"
        )
        return reason, NoFirstProgress(phase, round(waited, 3), limit)

    return [Condition(entered + limit, Verdict.STALLED, describe, entered)]


def _deadline(health: HealthSpec, facts: Facts) -> list[Condition]:
    if facts.phase is None or facts.phase not in health.phase_deadline_s:
        return []
    limit = health.phase_deadline_s[facts.phase]
    entered = facts.phase_entered_at
    phase = facts.phase_name

    def describe(at: float) -> tuple[str, Evidence]:
        spent = at - entered
        reason = (
            f"phase {phase} exceeded its deadline of {format_duration(limit)} "
            f"(in it for {format_duration(spent)})"
        )
        return reason, PastDeadline(phase, round(spent, 3), limit)

    return [Condition(entered + limit, Verdict.STALLED, describe, entered)]


def _silence(health: HealthSpec, facts: Facts) -> list[Condition]:
    limit = silence_limit(health, facts.known_phase)
    if limit is None:
        return []
    # A `WATCHDOG=1` ping is word from the program as much as a line is: a phase that prints
    # nothing for an hour (a checkpoint, a data pass) is not silent while it pings.
    last = facts.last_output_at if facts.pinged_at is None else max(facts.last_output_at, facts.pinged_at)
    phase = facts.phase_name
    where = f"in phase {phase}" if facts.known_phase is not None else "before any phase"

    def describe(at: float) -> tuple[str, Evidence]:
        quiet = at - last
        reason = f"no output for {format_duration(quiet)} {where} (limit {format_duration(limit)})"
        return reason, Silent(phase, round(quiet, 3), limit)

    return [Condition(last + limit, Verdict.SILENT, describe, last)]


def _no_ping(health: HealthSpec, facts: Facts) -> list[Condition]:
    # systemd's WatchdogSec: counted from the start until the first ping, as systemd counts it,
    # whatever the program prints meanwhile (a program that pings from its main loop and is stuck
    # in it may well go on printing from another thread).
    limit = health.watchdog_s
    if limit is None:
        return []
    base = facts.started_at if facts.pings_heard_from is None else max(facts.started_at, facts.pings_heard_from)
    last = base if facts.pinged_at is None else max(base, facts.pinged_at)
    ever = facts.pinged_at is not None
    restarted = facts.pings_heard_from is not None
    phase = facts.phase_name

    def describe(at: float) -> tuple[str, Evidence]:
        quiet = at - last
        since = "since its last" if ever else "and none since the daemon began to listen" if restarted \
            else "and none since its start"
        reason = f"no WATCHDOG=1 heartbeat for {format_duration(quiet)} {since} (watchdog_s {format_duration(limit)})"
        return reason, Unpinged(phase, round(quiet, 3), limit, ever)

    return [Condition(last + limit, Verdict.SILENT, describe, last)]


def silence_limit(health: HealthSpec, phase: Phase | None) -> float | None:
    """How long the job may print nothing in ``phase`` (None: no phase yet); None: no bound."""
    if phase is None:
        return min(health.silence_before_phase_s, health.silence_s or health.silence_before_phase_s)
    return health.silence_s if phase in health.silence_phases else None


def _hang_after_failure(health: HealthSpec, facts: Facts) -> list[Condition]:
    # A phase change or a progress step after the failure means the process recovered
    # (vLLM logs a full traceback at WARNING during a healthy start, then becomes ready).
    limit = health.hang_after_failure_s
    failure = facts.unrecovered_failure
    # A ready server that logged one failed request and then idles is not hung; when its
    # engine dies, vLLM exits and the exit is judged.
    if limit is None or failure is None or facts.phase is Phase.ENGINE_READY:
        return []
    last = facts.last_active_at  # "still waiting" lines after a failure are the hang itself
    verdict = Verdict.OOM if failure.kind == FailureKind.CUDA_OOM else Verdict.CRASHED
    phase = facts.phase_name
    blamed = failure_evidence(failure, facts.failure_count)

    def describe(at: float) -> tuple[str, Evidence]:
        quiet = at - last
        reason = f"hung after a failure, no output for {format_duration(quiet)}: {failure.line}"
        return reason, HungAfterFailure(phase, round(quiet, 3), limit, blamed)

    return [Condition(last + limit, verdict, describe, last)]


def _engine_dead(health: HealthSpec, facts: Facts) -> list[Condition]:
    # A fatal failure (vLLM's engine dead) while the process goes on printing: the API server
    # answers every request with an error.  It is judged however much it prints afterwards, and
    # in a ready server too, once the time a dying process is given to exit has passed.
    limit = health.hang_after_failure_s
    if limit is None or facts.fatal is None:
        return []
    since, failure = facts.fatal
    blamed = failure_evidence(facts.primary_failure or failure, facts.failure_count)
    # (the root cause is blamed: the fatal line is most often an echo of it)
    phase = facts.phase_name

    def describe(at: float) -> tuple[str, Evidence]:
        reason = f"still running {format_duration(at - since)} after a fatal failure: {failure.line}"
        return reason, EngineDead(phase, round(at - since, 3), limit, failure.line, blamed)

    root = facts.primary_failure or failure
    verdict = Verdict.OOM if root.kind == FailureKind.CUDA_OOM else Verdict.CRASHED
    return [Condition(since + limit, verdict, describe, since)]


def _waiting(health: HealthSpec, facts: Facts) -> list[Condition]:
    # Before any phase is recognised nothing is known about the program: no rule.
    limit = health.waiting_s
    if limit is None or facts.known_phase not in health.waiting_phases:
        return []
    since = facts.last_active_at
    heartbeat = facts.heartbeat if facts.heartbeat and facts.heartbeat[0] >= since else None
    phase = facts.phase_name

    def describe(at: float) -> tuple[str, Evidence]:
        waited = format_duration(at - since)
        where = f"in start-up phase {phase} (limit {format_duration(limit)})"
        if heartbeat is not None:
            reason = f"only 'still waiting' lines for {waited} {where}: {heartbeat[1]}"
        else:
            reason = f"no output for {waited} {where}"
        return reason, StillWaiting(phase, round(at - since, 3), limit, heartbeat[1] if heartbeat else None)

    return [Condition(since + limit, Verdict.STALLED, describe, since)]


def label(probe: str) -> str:
    # "vllm.shards" -> "shard": the probe id names what is being counted.
    name = probe.rsplit(".", 1)[-1]
    return name[:-1] if name.endswith("s") and len(name) > 1 else name
