"""The wall-clock limit (`max_runtime`, systemd's RuntimeMaxSec, Slurm's --time): an attempt still
running that long after its start is `timeout`, whatever it is doing.  Counted from the attempt's
true start, so a daemon restart (a re-adopted attempt) does not give it the time again."""

from __future__ import annotations

from supervisor.core.events import Verdict
from supervisor.watchdog._conditions import Condition, format_duration
from supervisor.watchdog._evidence import Evidence, PastMaxRuntime
from supervisor.watchdog._facts import Facts


def past_max_runtime(limit: float | None, facts: Facts) -> list[Condition]:
    if limit is None:
        return []
    started = facts.started_at
    phase = facts.phase_name

    def describe(at: float) -> tuple[str, Evidence]:
        ran = at - started
        return f"ran past max_runtime {format_duration(limit)}", PastMaxRuntime(phase, round(ran, 3), limit)

    return [Condition(started + limit, Verdict.TIMEOUT, describe, started)]
