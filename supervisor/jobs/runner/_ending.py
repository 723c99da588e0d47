"""How an attempt ends once it is judged: a tree still alive is killed (its stacks dumped first,
when it was judged while alive), the GPU memory it held is awaited back, what it used is stored,
and its end is recorded with the action that follows (relaunch, give up, none)."""

from __future__ import annotations

import structlog

from supervisor.core.actions import AttemptAction
from supervisor.core.errors import SuperviseError
from supervisor.core.events import AttemptState, EventKind, Verdict
from supervisor.core.payloads import ActionData, ExitedData
from supervisor.gpu.nvml import ReleaseResult, baseline_of, wait_for_release
from supervisor.hosts.base import ExitStatus, KillReport, UsageReader
from supervisor.jobs.runner._alerts import Alerts
from supervisor.jobs.runner._context import Live, RunnerContext, describe_exit
from supervisor.jobs.runner._journal import Journal
from supervisor.jobs.runner._verdict import Verdicts
from supervisor.spec.model import JobSpec
from supervisor.store.attempt_writes import AttemptEnd, AttemptUpdate, ExitCode
from supervisor.watchdog import Judgement

log = structlog.get_logger("supervise.runner")

_FINAL_VERDICTS = {Verdict.CRASHED, Verdict.OOM, Verdict.KILLED, Verdict.LIMIT, Verdict.DONE}


def gpu_baseline(ctx: RunnerContext) -> dict[int, int]:
    """GPU memory in use on each device now (the latest sample): an attempt's release is measured against it."""
    sample = ctx.gpu.latest()
    if sample is None or not sample.available:
        return {}
    return baseline_of(sample, None)


def exited(journal: Journal, live: Live, status: ExitStatus) -> None:
    """The attempt's command ended (``status``, as its watch saw it): stored, and told as an event."""
    live.end.exit_status = status
    n = live.row.n
    journal.update(n, AttemptUpdate(exit_code=status.returncode, exit_signal=status.signal))
    journal.record(n, EventKind.EXITED, f"attempt {n} {status.describe()}", ExitedData(status.returncode, status.signal))


class Ending:
    def __init__(self, spec: JobSpec, ctx: RunnerContext, journal: Journal, alerts: Alerts, verdicts: Verdicts) -> None:
        self._spec = spec
        self._ctx = ctx
        self._journal = journal
        self._alerts = alerts
        self._verdicts = verdicts  # the stacks before a kill, and the kill

    async def kill_what_is_left(self, live: Live, judgement: Judgement) -> KillReport | None:
        """Kill the attempt's tree, unless it ended and left nothing running (None)."""
        host = self._ctx.host
        if judgement.verdict in _FINAL_VERDICTS and not await host.attempt_pids(live.handle):
            return None
        # Judged while alive (stalled, silent, hung): why, before the kill.  Not at a time limit,
        # where the stacks would only show the program at work.
        if live.exit_status is None and judgement.verdict is not Verdict.TIMEOUT:
            await self._verdicts.dump_stacks(live, judgement, "before the kill")
        # A program that ended on its own has no checkpoint left to write: no first signal.
        report = await self._verdicts.kill(live, self._spec.stop_grace_s, forewarn=live.exit_status is None)
        if live.exit_status is None:  # killed while alive (stalled, silent): record how it ended
            status = await host.exit_status(live.handle)
            if status is not None:
                live.end.exit_status = status
                self._journal.update(live.row.n, AttemptUpdate(exit_code=status.returncode, exit_signal=status.signal))
        self._journal.action(live.row.n, f"killed the process tree: {report.summary()}",
                             ActionData(terminated=report.terminated, killed=report.killed,
                                        survivors=report.survivors, reparented=report.reparented))
        return report

    async def gpus_released(self, live: Live) -> bool:
        """Whether the GPU memory the attempt held came back (alerted when it did not)."""
        ctx = self._ctx
        sample = ctx.gpu.latest()
        if sample is None or not sample.available:
            return True
        gpu = self._spec.gpu
        devices = None if gpu.devices == "all" else list(gpu.devices)
        # Every pid the attempt ever showed: NVML may still list a process that psutil no longer sees.
        known = {live.handle.pid} | live.known_pids | await ctx.host.attempt_pids(live.handle)

        async def wait() -> ReleaseResult:
            return await wait_for_release(ctx.gpu.sample, devices, live.gpu_baseline, lambda: known,
                                          tolerance_mib=gpu.release_tolerance_mib, timeout_s=gpu.release_timeout_s)

        result = await wait()
        if not result.released and await ctx.host.attempt_pids(live.handle):
            # Last resort: anything still alive that carries the attempt's tag is killed outright.
            await ctx.host.kill_tree(live.handle, 0)
            result = await wait()
        self._journal.action(live.row.n, f"GPU memory {'released' if result.released else 'STILL HELD'} "
                                         f"after {result.waited_s:.1f}s",
                             ActionData(released=result.released, waited_s=result.waited_s))
        if not result.released:
            await self._alerts.verdict(live, Judgement(Verdict.LEAKED, "GPU memory leaked"),
                                       "not relaunching: GPU memory still held")
        return result.released

    async def record_usage(self, live: Live) -> None:
        """What the attempt used, stored with it: its GPU figures, and its cgroup's where the host has one."""
        host = self._ctx.host
        from_host = None
        if isinstance(host, UsageReader):
            try:
                from_host = await host.attempt_usage(live.handle)
            except (SuperviseError, OSError) as exc:
                log.warning("cannot read what the attempt used", job=self._spec.name, attempt=live.row.n, error=str(exc))
        live.row.usage = live.gpu_meter.usage().with_host(from_host)
        self._journal.update(live.row.n, AttemptUpdate(usage=live.row.usage))

    async def record_stopped(self, live: Live) -> None:
        """The attempt ended by the user's stop: no verdict (a stop is no judgement on the job)."""
        await self.record_usage(live)
        stopped, n = AttemptAction.stopped(), live.row.n
        end = AttemptEnd(state=AttemptState.STOPPED, at=live.ended_at(), action=stopped,
                         reason=f"stopped by user; the command {describe_exit(live.exit_status)}")
        self._journal.ended(n, end, self._journal.event(n, EventKind.ACTION, stopped.text, ActionData()))

    async def record_unwatched(self, live: Live, status: ExitStatus, reason: str, *, stopped: bool) -> None:
        """The attempt's exit, awaited alone once supervising it failed (``reason``): no verdict."""
        live.end.exit_status = status
        await self.record_usage(live)
        n = live.row.n
        end = AttemptEnd(state=AttemptState.STOPPED if stopped else AttemptState.ENDED, at=live.ended_at(),
                         action=AttemptAction.stopped() if stopped else AttemptAction.none("supervision failed"),
                         exit=ExitCode(status.returncode, status.signal), reason=f"{reason}; the command {status.describe()}")
        self._journal.ended(n, end, self._journal.event(n, EventKind.EXITED, f"attempt {n} {status.describe()}",
                                                        ExitedData(status.returncode, status.signal)))

    async def record(self, live: Live, judgement: Judgement, action: AttemptAction) -> None:
        """The attempt ended, judged, and what follows."""
        await self.record_usage(live)
        n = live.row.n
        end = AttemptEnd(state=AttemptState.ENDED, at=live.ended_at(), action=action, verdict=judgement.verdict,
                         reason=judgement.reason)
        self._journal.ended(n, end, self._journal.event(n, EventKind.ACTION, action.text, ActionData()))
