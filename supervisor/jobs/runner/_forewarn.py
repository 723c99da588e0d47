"""The signal a job asked for before any kill of it (`kill_signal_first`): sent to its program,
then up to `checkpoint_grace_s` to save a checkpoint (ending early when the program exits), before
the kill's usual TERM, grace and KILL.  The same for a user's stop and a watchdog kill."""

from __future__ import annotations

from supervisor.core.payloads import ActionData
from supervisor.hosts.base import Forewarner, Host, ProcessHandle
from supervisor.jobs.runner._journal import Journal
from supervisor.spec.forewarn import DEFAULT_CHECKPOINT_GRACE_S, first_signal
from supervisor.spec.model import JobSpec


async def forewarn(spec: JobSpec, host: Host, handle: ProcessHandle, journal: Journal, n: int) -> None:
    """Send the spec's first signal and wait for the program; said in the attempt's events."""
    if spec.kill_signal_first is None or not isinstance(host, Forewarner):
        return  # the spec refuses the field on hosts that cannot send it
    grace = DEFAULT_CHECKPOINT_GRACE_S if spec.checkpoint_grace_s is None else spec.checkpoint_grace_s
    done = await host.forewarn(handle, first_signal(spec.kill_signal_first), grace)
    if done.pid is None:
        return  # no program left to warn: the kill finds what remains
    outcome = (f"it exited after {done.waited_s:.1f}s" if done.ended
               else f"it ran on through checkpoint_grace_s {grace:g}s")
    journal.action(n, f"sent {spec.kill_signal_first} to the program (pid {done.pid}) before the kill: {outcome}",
                   ActionData(waited_s=round(done.waited_s, 3)))
