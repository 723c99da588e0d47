"""The phase a log's events imply, by one rule for the live watchdog and the offline replay.

Both read the same bytes through the same engine; this is where they agree on what the events
mean for the phase, so that `status` and `supervise probe` name the same one:

- any event that implies a phase implies it, whatever its kind: a metric line such as vLLM's
  ``GPU KV cache size`` is as much a sign of ``kv_cache_profile`` as a phase line;
- phases only move forward (every TP rank prints the same phase lines at slightly different
  times; a late rank must not rewind the job);
- a failure before any phase is a failure at ``startup`` (``implied_phase``);
- ``done`` reached after a failure with no advance since (no progress step, no other phase) is
  no recovery: vLLM logs ``[shutdown] MPClient: complete`` after a dead worker, then exits 0;
- a server that answers a request after a failure (``serving`` lines with a status under 500)
  goes on working: the failure was one call's (vLLM's failed ``wake_up``), not the server's end;
- a failure of its own after a launcher said the workers' attempt failed (an ``attempt_over``
  probe: torchrun's ``failed (exitcode: 1) local_rank: 1``) is the next attempt's, the launcher
  having restarted them (``--max-restarts``): it, not the earlier attempt's, explains what follows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from supervisor.core.events import Failure, Phase, ProbeKind


def entered_phase(current: Phase | None, implied: Phase | None, *, recovered: bool) -> Phase | None:
    """The phase an event implying ``implied`` moves the log into, None when it stays in ``current``.
    ``recovered``: no failure was logged since the last advance (a progress step or a phase)."""
    if implied is None or (current is not None and implied.rank <= current.rank):
        return None
    if implied is Phase.DONE and not recovered:
        return None
    return implied


def implied_phase(kind: ProbeKind, phase: Phase | None, current: Phase | None) -> Phase | None:
    """The phase an event implies: its own, or for a failure logged before any line named a phase,
    ``startup``: a program that fails before its first step, progress line or phase line failed
    starting up, whatever it is (a one-line refusal, a traceback through its own code)."""
    if phase is None and current is None and kind is ProbeKind.FAILURE:
        return Phase.STARTUP
    return phase


def survived(failure_survivable: bool, phase: Phase | None) -> bool:
    """Whether a failure needs no advance after it to count as recovered: one the program logged
    below ERROR once it was ready (a failed request of a server that goes on serving).  Before
    ready, a WARNING traceback may be the crash being logged, so it needs an advance too."""
    return failure_survivable and phase is not None and phase.rank >= Phase.ENGINE_READY.rank


def entering_recovers(kind: ProbeKind, fields: Mapping[str, Any]) -> bool:
    """Whether entering a phase through this event shows the program going on after a failure.
    A bar's first draw at 0 does not: tqdm draws a bar when it is made, and a program that has
    just failed may still make one on its way out (vLLM 0.6.3's `Processed prompts 0/4` drawn
    after the TypeError that ended it)."""
    if kind is ProbeKind.FAILURE:
        return False
    if kind is ProbeKind.PROGRESS:
        done = fields.get("done")
        return not (done is None or done == 0 or done == "0")
    return True


def goes_on_serving(fields: Mapping[str, Any]) -> bool:
    """Whether an event shows a server answering a request successfully: normal operation going
    on, which a failure before it did not end."""
    if fields.get("serving") is not True:
        return False
    status = fields.get("status")
    try:
        return status is None or int(status) < 500
    except (TypeError, ValueError):
        return False


def starts_new_attempt(attempt_over: bool, failure: Failure) -> bool:
    """Whether ``failure`` is a restarted attempt's own: one that is not an echo, after a launcher
    said the attempt before failed."""
    return attempt_over and not failure.consequence


def ends_attempt(attempt_over: bool, failure: Failure, fields: Mapping[str, Any]) -> bool:
    """Whether, after ``failure``, the workers' attempt is over (the launcher said so, and no
    restarted attempt's failure has come since)."""
    if fields.get("attempt_over") is True:
        return True
    return attempt_over and failure.consequence
