"""A job's runner, one per job the daemon supervises: a short control loop over collaborators it
is given or makes, none of them a base class.

    _job        JobRunner, the loop: launch or adopt, watch, end the attempt, ask the policy, relaunch or stop
    _launch     launching one attempt (stored `launching` first, then `running`)
    _adopting   Readoption: an attempt taken over again (a daemon restart, a host that answers again)
    _watching   AttemptWatch: one attempt watched to its judgement (follower, matcher, watchdog, exit, backlog)
    _ending     Ending: what follows a judgement (what is left killed, the GPU memory given back, usage, the end recorded)
    _verdict    Verdicts: verdicts recorded, the kill gate (KillGate), stacks, hold and release, every kill
    _alerts     Alerts: alerts sent (they only say)
    _journal    Journal: job state, attempt fields and events, in order, through the jobs' Recorder
    _gpu_wait   GpuGate: before a launch, GPU memory other processes hold
    _pacing     Paces: each bar's pace, earlier attempts' and this one's
    _scope      Scope: what a runner's attempts belong to and where its state goes (JobScope; a shard's in sharding.py)
    _news       what a start awaits: the first attempt running, or a wait said at once
    _context    what a runner works with (context; its attempt's Live: handles, and state split by owner)
"""

from supervisor.jobs.runner._context import GpuView, RunnerContext, cancel_until_done
from supervisor.jobs.runner._job import JobRunner
from supervisor.jobs.runner._news import StartNews
from supervisor.jobs.runner._scope import JobScope, Scope

__all__ = ["GpuView", "JobRunner", "JobScope", "RunnerContext", "Scope", "StartNews", "cancel_until_done"]
