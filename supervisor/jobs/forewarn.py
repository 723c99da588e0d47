"""The signal a job asked for before any kill of it (`kill_signal_first`): sent to its program,
then up to `checkpoint_grace_s` to save a checkpoint (ending early when the program exits), before
the kill's usual TERM, grace and KILL.  One sending for every kill: a user's stop, a watchdog kill,
and the stop of an attempt nobody watched (strays.py)."""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.core.payloads import ActionData
from supervisor.hosts.base import Forewarner, Host, ProcessHandle
from supervisor.spec.forewarn import DEFAULT_CHECKPOINT_GRACE_S, first_signal
from supervisor.spec.model import JobSpec


@dataclass(frozen=True)
class Forewarned:
    """What sending the first signal did, as the attempt's action event says it."""

    message: str
    data: ActionData


async def forewarn(spec: JobSpec, host: Host, handle: ProcessHandle) -> Forewarned | None:
    """Send the spec's first signal and wait for the program; None when there was none to send
    or no program left to receive it."""
    if spec.kill_signal_first is None or not isinstance(host, Forewarner):
        return None  # the spec refuses the field on hosts that cannot send it
    grace = DEFAULT_CHECKPOINT_GRACE_S if spec.checkpoint_grace_s is None else spec.checkpoint_grace_s
    done = await host.forewarn(handle, first_signal(spec.kill_signal_first), grace)
    if done.pid is None:
        return None  # no program left to warn: the kill finds what remains
    outcome = (f"it exited after {done.waited_s:.1f}s" if done.ended
               else f"it ran on through checkpoint_grace_s {grace:g}s")
    return Forewarned(message=f"sent {spec.kill_signal_first} to the program (pid {done.pid}) before the kill: {outcome}",
                      data=ActionData(waited_s=round(done.waited_s, 3)))
