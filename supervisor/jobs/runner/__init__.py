"""A job's runner, one per job the daemon supervises.

    _job        the control loop: launch or adopt, judge, clean up, relaunch with backoff or stop
    _watching   watching one attempt: follow and match its log, await its exit, ask the watchdog
    _scope      what a runner's attempts belong to and where its state goes (a job's, a shard's)
    _news       what a start awaits: the first attempt running, or a wait said at once
    _context    what a runner works with (context, live handles) and how it records events
"""

from supervisor.jobs.runner._context import GpuView, RunnerContext, cancel_until_done
from supervisor.jobs.runner._job import JobRunner
from supervisor.jobs.runner._news import StartNews
from supervisor.jobs.runner._scope import JobScope

__all__ = ["GpuView", "JobRunner", "JobScope", "RunnerContext", "StartNews", "cancel_until_done"]
