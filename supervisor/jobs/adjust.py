"""The parameters a relaunch runs with: the failed attempt's, changed by the spec's
`[restart.adjust]` rule for its verdict (spec/adjust.py holds the rule and its arithmetic).

Cumulative by construction: each attempt stores the parameters it ran with (None: the spec's own,
unchanged), and the next is worked out from those, so a daemon restart in between loses nothing."""

from __future__ import annotations

from supervisor.core.events import Verdict
from supervisor.spec.model import JobSpec
from supervisor.store.database import AttemptRow


def params_after(spec: JobSpec, ended: AttemptRow, verdict: Verdict) -> dict[str, str] | None:
    """The parameters of the attempt after ``ended`` (judged ``verdict``); None: the spec's own."""
    rule = spec.restart.adjust.get(verdict)
    if rule is None:
        return ended.params
    return rule.apply(ended.params if ended.params is not None else dict(spec.params))
