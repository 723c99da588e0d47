"""The runner's memory of each bar's pace: earlier attempts' intervals handed to a new attempt's
watchdog (its stall bounds start from them), this attempt's intervals stored for the next, and a
step well over its history alerted as ``slow`` (an alert, never a kill)."""

from __future__ import annotations

import structlog

from supervisor.core.errors import StoreError
from supervisor.core.payloads import ActionData, SlowStep
from supervisor.jobs.runner._context import Live
from supervisor.jobs.runner._notifying import Notifying
from supervisor.notify import notices
from supervisor.store.paces import PaceStore, spec_fingerprint
from supervisor.watchdog import PaceHistory, Watchdog

log = structlog.get_logger("supervise.runner")


class Pacing(Notifying):
    """The half of a job runner that remembers bar paces across attempts."""

    _slow_sent: set[tuple[int, str]]  # (attempt, bar and step) already reported slow

    def _host_kind(self) -> str:
        """Where the pace was measured: the host, and the GPU model where one is seen."""
        sample = self.ctx.gpu.latest()
        model = sample.devices[0].name if sample is not None and sample.available and sample.devices else ""
        return f"{self.ctx.host.name}/{model}" if model else self.ctx.host.name

    def _pace_history(self, n: int) -> PaceHistory:
        try:
            return PaceStore(self.ctx.store).history(self.spec.name, spec_fingerprint(self.spec), self._host_kind(),
                                                     before=n)
        except StoreError as exc:  # the default bounds still hold
            log.warning("cannot read earlier bar paces", job=self.spec.name, error=str(exc))
            return PaceHistory()

    def _new_watchdog(self, n: int, started_at: float | None = None) -> Watchdog:
        return Watchdog(self.spec.health, clock=self.ctx.clock, history=self._pace_history(n), started_at=started_at)

    def _store_paces(self, live: Live) -> None:
        """This attempt's intervals, for the next attempt's bounds (replaced as it goes on)."""
        paces, n = live.watchdog.paces(), live.row.n
        if not paces:
            return
        job, fingerprint, host_kind = self.spec.name, spec_fingerprint(self.spec), self._host_kind()
        self._writes.submit(lambda: PaceStore(self.ctx.store).save(job, fingerprint, host_kind, n, paces))

    def _report_slow(self, live: Live) -> None:
        """A step well over its history, once per bar and step: alerted, and stored as an event."""
        for key, judgement in live.watchdog.slow():
            if (live.row.n, key) in self._slow_sent:
                continue
            self._slow_sent.add((live.row.n, key))
            where = notices.where(live.watchdog.progress, live.watchdog.phase)
            self._action(live, f"slow {where}: {judgement.reason}", ActionData(slow=SlowStep.from_json(judgement.evidence)))
            self._send_soon(live, notices.slow(self._about(live), judgement, where))
