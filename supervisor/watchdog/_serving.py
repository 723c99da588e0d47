"""A serving engine that is up but does no work: vLLM's periodic throughput lines (and SGLang's
decode-batch lines) saying 0 tokens/s while requests run or wait.

A hung engine keeps its API server answering health checks and keeps printing these lines, so
neither silence nor a stalled bar catches it: the job looks healthy while every request waits
forever.  ``EngineLoad`` folds the lines (fields ``gen_tps``, ``prompt_tps``, ``running``,
``waiting``, from the packs); ``hung_engine`` is the rule: zero throughput with work for
``health.hung_s`` is ``hung``.  Any line with throughput, or with nothing to do, ends it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from supervisor.core.events import Verdict
from supervisor.spec.tables import HealthSpec
from supervisor.watchdog._conditions import Condition, format_duration
from supervisor.watchdog._evidence import EngineHung, Evidence


@dataclass
class EngineLoad:
    """What the latest throughput lines said, and since when there has been work and no output."""

    stuck_since: float | None = None  # the first of the zero-throughput-with-work lines in a row
    running: int = 0
    waiting: int = 0
    lines: int = 0  # zero-throughput-with-work lines in a row
    without_work: bool = False  # the latest throughput line: no request runs or waits (an idle server)

    def observe(self, data: Mapping[str, Any], at: float) -> None:
        gen = _number(data.get("gen_tps"))
        if gen is None:
            return  # not a throughput line
        prompt = _number(data.get("prompt_tps")) or 0.0
        # SGLang's decode batch counts its running requests as `reqs`.
        self.running = int(_number(data.get("running", data.get("reqs"))) or 0)
        self.waiting = int(_number(data.get("waiting")) or 0)
        self.without_work = self.running + self.waiting == 0
        if gen == 0 and prompt == 0 and self.running + self.waiting > 0:
            if self.stuck_since is None:
                self.stuck_since = at
            self.lines += 1
        else:
            self.stuck_since, self.lines = None, 0


def hung_engine(health: HealthSpec, load: EngineLoad) -> list[Condition]:
    limit = health.hung_s
    since = load.stuck_since
    if limit is None or since is None:
        return []
    running, waiting, lines = load.running, load.waiting, load.lines

    def describe(at: float) -> tuple[str, Evidence]:
        stuck = at - since
        reason = (f"engine hung: 0 tokens/s with {running} running and {waiting} waiting requests for "
                  f"{format_duration(stuck)} ({lines} throughput lines; limit {format_duration(limit)})")
        return reason, EngineHung(running, waiting, round(stuck, 3), limit, lines)

    return [Condition(since + limit, Verdict.HUNG, describe, since)]


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None
