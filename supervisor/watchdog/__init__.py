"""Per-attempt health judgement.

A ``Watchdog`` folds one attempt's probe events (phases, progress bars, failures,
heartbeats) and the arrival of any output into a small state, and judges it against
the job's ``HealthSpec`` with an injectable clock:

- ``check()`` while the process runs: healthy, stalled (stuck progress or a phase past
  its deadline), silent (no output at all for too long) or crashed/oom (a failure was
  logged and the process has hung since: the surviving ranks of a dead one);
- ``exited()`` once it has ended: done, crashed or oom.

Nothing here sleeps or polls: ``next_check_at()`` says when the verdict could next
change with no new event, so the daemon sleeps exactly until then (or until the next
event, after which it asks again).  ``state()`` is all of it in one frozen value.

Modules: ``_facts`` (events folded into what has been seen), ``_progress`` (a bar's
position and rate), ``_rules`` (the rules and their bounds), ``_exit`` (the judgement at
exit), ``_pace`` (earlier attempts' bar paces, injected as a value), ``_judge`` (the
``Watchdog`` that ties them together), ``_straggler`` (one process's bar well behind its peers'),
``_evidence`` (what each judgement rests on, a typed value per rule; a dict only where stored or sent),
``_redraws`` (a run of one bar's redraws read together, taken as one summary).
"""

from supervisor.watchdog._conditions import Judgement, fine_duration, format_duration
from supervisor.watchdog._evidence import Evidence, ExitNoted, NoEvidence, SchedulerEnded, slow_step
from supervisor.watchdog._judge import Watchdog, WatchdogState
from supervisor.watchdog._pace import BarPace, BoundSource, PaceHistory, bar_key
from supervisor.watchdog._progress import ProgressState
from supervisor.watchdog._redraws import Redraws, inert
from supervisor.watchdog._rules import label
from supervisor.watchdog._straggler import Straggler

__all__ = [
           "BarPace",
           "BoundSource",
           "Evidence",
           "ExitNoted",
           "Judgement",
           "NoEvidence",
           "PaceHistory",
           "ProgressState",
           "Redraws",
           "SchedulerEnded",
           "Straggler",
           "Watchdog",
           "WatchdogState",
           "bar_key",
           "fine_duration",
           "format_duration",
           "inert",
           "label",
           "slow_step",
]
