"""GPUs allocated and doing nothing: an attempt whose GPUs show 0% utilisation while it makes no
progress (no bar step, no new phase) for ``health.idle_s`` is ``idle``.

A job that waits on a dead peer, a data loader stuck on a network mount, or a rank spinning in
a collective with nothing to compute holds its GPUs for nothing; none of it prints.  ``GpuUse``
is fed by the runner from the host's GPU samples (only the devices the attempt's processes are
on); the rule is silent until a sample has shown the attempt on a GPU, and for a server with
nothing to do (its last throughput line said no request runs or waits).
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.core.events import Verdict
from supervisor.spec.tables import HealthSpec
from supervisor.watchdog._conditions import Condition, format_duration
from supervisor.watchdog._evidence import Evidence, Idle


@dataclass
class GpuUse:
    seen_at: float | None = None  # the first sample that showed the attempt on a GPU
    busy_at: float | None = None  # the latest sample in which one of its GPUs computed
    devices: tuple[int, ...] = ()

    def sampled(self, devices: tuple[int, ...], busy: bool, at: float) -> None:
        if not devices:
            return
        self.devices = devices
        if self.seen_at is None:
            self.seen_at = at
        if busy:
            self.busy_at = at


def idle(health: HealthSpec, use: GpuUse, moved_at: float, server_without_work: bool) -> list[Condition]:
    limit = health.idle_s
    if limit is None or use.seen_at is None or server_without_work:
        return []
    since = max(use.busy_at or use.seen_at, moved_at)
    devices = ", ".join(str(d) for d in use.devices)

    def describe(at: float) -> tuple[str, Evidence]:
        quiet = at - since
        return (f"GPU {devices} at 0% utilisation and no progress for {format_duration(quiet)} "
                f"(limit {format_duration(limit)})", Idle(tuple(use.devices), round(quiet, 3), limit))

    return [Condition(since + limit, Verdict.IDLE, describe, since)]
