"""A job's runner, one per job the daemon supervises: a short control loop over collaborators it
is given or makes, none of them a base class.

    _job        JobRunner, the loop: launch or adopt, watch, end the attempt, ask the policy, relaunch or stop; the processes it sees
    _launch     launching one attempt (stored `launching` first, then `running`); StartPoint; Paces
    _adopting   Readoption: an attempt taken over again (a daemon restart, a host that answers again)
    _watching   AttemptWatch: one attempt watched to its judgement (queue, follower, matcher, watchdog, exit, drain)
    _verdict    Verdicts: verdicts recorded, the kill gate (KillGate), stacks and forensics, hold and release, every kill
    _ending     Ending: what follows a judgement (what is left killed, the GPU memory given back, usage, the end recorded)
    _alerts     Alerts: alerts sent (they only say); StragglerReports
    _waits      waits outside a watch: `after`, an unreachable host, GpuGate, KeepAway
    _disk       DiskWatch: the output folder's free space while an attempt runs
    _heartbeat  Heartbeat: what an attempt says on its NOTIFY_SOCKET
    _journal    Journal: job state, attempt fields and events, in order, through the jobs' Recorder; Scope; StartNews
    _context    what a runner works with (context; its attempt's Live: handles, and state split by owner; CatchUp)
"""

from supervisor.jobs.runner._context import GpuView, RunnerContext, cancel_until_done
from supervisor.jobs.runner._job import JobRunner
from supervisor.jobs.runner._journal import JobScope, Scope, StartNews

__all__ = ["GpuView", "JobRunner", "JobScope", "RunnerContext", "Scope", "StartNews", "cancel_until_done"]
