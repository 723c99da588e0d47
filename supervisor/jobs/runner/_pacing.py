"""The runner's memory of each bar's pace: earlier attempts' intervals handed to a new attempt's
watchdog (its stall bounds start from them), this attempt's intervals stored for the next, and a
step well over its history alerted as ``slow`` (an alert, never a kill)."""

from __future__ import annotations

from dataclasses import dataclass

import structlog

from supervisor.core.errors import StoreError
from supervisor.jobs.paces import PaceStore, spec_fingerprint
from supervisor.jobs.pending import PendingWrites
from supervisor.jobs.runner._context import Live, RunnerContext
from supervisor.notify import notices
from supervisor.spec.model import JobSpec
from supervisor.watchdog import Judgement, PaceHistory, Watchdog

log = structlog.get_logger("supervise.runner")


@dataclass(frozen=True)
class SlowFound:
    """A bar's step well over its history, not reported before: what the runner alerts."""

    where: str  # the bar and phase, in words
    judgement: Judgement


class Paces:
    """A runner's memory of each bar's pace, composed into the runner (it acts on what this says):
    the history a new attempt's watchdog starts from, this attempt's intervals stored for the
    next, and the slow steps not reported yet."""

    def __init__(self, spec: JobSpec, ctx: RunnerContext, writes: PendingWrites) -> None:
        self._spec = spec
        self._ctx = ctx
        self._writes = writes
        self._reported: set[tuple[int, str]] = set()  # (attempt, bar and step) already reported slow

    def _host_kind(self) -> str:
        """Where the pace was measured: the host, and the GPU model where one is seen."""
        sample = self._ctx.gpu.latest()
        model = sample.devices[0].name if sample is not None and sample.available and sample.devices else ""
        return f"{self._ctx.host.name}/{model}" if model else self._ctx.host.name

    def history(self, n: int) -> PaceHistory:
        try:
            return PaceStore(self._ctx.store).history(self._spec.name, spec_fingerprint(self._spec),
                                                      self._host_kind(), before=n)
        except StoreError as exc:  # the default bounds still hold
            log.warning("cannot read earlier bar paces", job=self._spec.name, error=str(exc))
            return PaceHistory()

    def new_watchdog(self, n: int, started_at: float | None = None) -> Watchdog:
        return Watchdog(self._spec.health, clock=self._ctx.clock, history=self.history(n), started_at=started_at,
                        max_runtime_s=self._spec.max_runtime)

    def store(self, live: Live) -> None:
        """This attempt's intervals, for the next attempt's bounds (replaced as it goes on)."""
        paces, n = live.watchdog.paces(), live.row.n
        if not paces:
            return
        job, fingerprint, host_kind = self._spec.name, spec_fingerprint(self._spec), self._host_kind()
        store = self._ctx.store
        self._writes.submit(lambda: PaceStore(store).save(job, fingerprint, host_kind, n, paces))

    def new_slow_steps(self, live: Live) -> list[SlowFound]:
        """Steps well over their history, each once per bar and step."""
        found = []
        for key, judgement in live.watchdog.slow():
            if (live.row.n, key) in self._reported:
                continue
            self._reported.add((live.row.n, key))
            found.append(SlowFound(notices.where(live.watchdog.progress, live.watchdog.phase), judgement))
        return found
