"""Training that diverges: a loss that becomes NaN or infinite, or stays far above where it was.

``LossTrack`` folds the ``loss`` field of any event that carries one (the train job's step
lines, the HF Trainer's log dicts, generic ``step N loss X`` lines, Megatron's iteration
lines); ``diverged`` is the rule.  A non-finite loss is due at once; a finite one is due after
``health.diverge_steps`` readings in a row above ``health.diverge_k`` x the median of the
readings before them (at least ``_MIN_BASELINE`` of them, so a first noisy step proves
nothing).  One spike is not divergence: any reading back under the bound ends the run of them.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from supervisor.core.events import Verdict
from supervisor.spec.tables import HealthSpec
from supervisor.watchdog._conditions import Condition
from supervisor.watchdog._evidence import Diverged, Evidence, LossNotFinite

_BASELINE = 64  # readings the median is taken over
_MIN_BASELINE = 8


@dataclass
class LossTrack:
    k: float | None = None  # health.diverge_k: None, only a non-finite loss counts
    baseline: deque[float] = field(default_factory=lambda: deque(maxlen=_BASELINE))
    above: list[float] = field(default_factory=list)  # readings in a row over the bound
    above_since: float | None = None
    bound: float | None = None
    not_finite: tuple[float, str] | None = None  # when, and the value as printed

    def observe(self, data: Mapping[str, Any], at: float) -> None:
        k = self.k
        raw = data.get("loss")
        if raw is None or isinstance(raw, bool):
            return
        try:
            loss = float(raw)
        except (TypeError, ValueError):
            return
        if not math.isfinite(loss):
            if self.not_finite is None:
                self.not_finite = (at, str(raw))
            return
        if k is not None and len(self.baseline) >= _MIN_BASELINE:
            bound = k * statistics.median(self.baseline)
            if bound > 0 and loss > bound:
                if not self.above:
                    self.above_since, self.bound = at, bound
                self.above.append(loss)
                return  # a diverging run's readings do not move the baseline up
        self.above, self.above_since, self.bound = [], None, None
        self.baseline.append(loss)


def diverged(health: HealthSpec, loss: LossTrack) -> list[Condition]:
    if loss.not_finite is not None:
        at, value = loss.not_finite

        def describe_nan(_: float) -> tuple[str, Evidence]:
            return f"training diverged: loss is {value}", LossNotFinite(value)

        return [Condition(at, Verdict.DIVERGED, describe_nan, at)]
    steps = health.diverge_steps
    if health.diverge_k is None or loss.above_since is None or len(loss.above) < steps:
        return []
    since, bound, readings = loss.above_since, loss.bound or 0.0, list(loss.above)

    def describe(_: float) -> tuple[str, Evidence]:
        return (f"training diverged: loss {readings[-1]:.4g}, over {bound:.4g} ({health.diverge_k:g} x its median) "
                f"for {len(readings)} readings in a row", Diverged(readings[-1], round(bound, 6), len(readings)))

    return [Condition(since, Verdict.DIVERGED, describe, since)]
