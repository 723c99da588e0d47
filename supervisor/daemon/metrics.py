"""Prometheus metrics of the daemon, its jobs and its GPUs.

Served at `/metrics` on the control socket, and over TCP on a loopback address when
`metrics_addr` is set (`SUPERVISE_METRICS_ADDR=127.0.0.1:9464`).  Names follow Prometheus
conventions: prefix `supervise_`, base units (seconds, bytes), `_total` for counters,
labels `job`, `gpu`, `host`, `kind`.  A sharded job's `supervise_job_*` gauges follow its latest
attempt, whichever shard ran it; `supervise_shard_*` gauges carry each shard (`shard`: its index,
`gather` for the gather step) from the job's latest run, and `supervise_shard_*_total` counters
count each shard's failures, verdicts and launches (the job's counters count them all).

Two sources:
- counters fed by the event bus (failures by kind, verdicts, launches) and by the runner
  (records read from logs: `rate(supervise_probe_records_total[1m])` is lines per second);
- gauges computed at scrape time from what the daemon holds (store, runner snapshots, the
  latest GPU sample), so a scrape always shows the present and survives daemon restarts.
  The daemon hands these over through a `MetricsSource`: metrics never import the daemon.

Per-job GPU memory is attributed through the attempt's processes: every pid that carries
the attempt's tag (its process tree, workers re-parented to init included) and that NVML
lists on a device.  Memory held by a job that is no longer running is a leak
(`deploy/alerts.yml`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from supervisor import __version__
from supervisor.core.events import Event, EventKind, FailureKind, JobState, Phase
from supervisor.core.payloads import VerdictData
from supervisor.core.progress import BarProgress
from supervisor.gpu.nvml import GpuSample
from supervisor.hosts.base import Host, ProcessHandle
from supervisor.jobs.shard_views import GATHER, ShardRows
from supervisor.jobs.snapshot import RunnerSnapshot
from supervisor.notify.alerts import AlertCounts
from supervisor.store.database import AttemptRow, JobRow

log = structlog.get_logger("supervise.metrics")

# The classic text format, which every Prometheus version parses (the names here need no escaping).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MIB = 1024 * 1024
LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_ATTRIBUTION_TTL_S = 2.0  # per-job GPU memory is recomputed at most this often
_ATTRIBUTION_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class JobReading:
    """One job as a scrape sees it."""

    job: JobRow
    latest: AttemptRow | None  # its latest attempt
    runner: RunnerSnapshot | None  # its runner now; None when no runner watches it
    shards: tuple[ShardRows, ...] = ()  # a sharded job: each shard in its latest run; () unsharded


@dataclass(frozen=True, slots=True)
class HostReading:
    """One host as a scrape sees it."""

    name: str
    gpu: GpuSample | None  # its latest GPU sample; None before the first
    host: Host  # asked which processes belong to an attempt


class MetricsSource(Protocol):
    """What the metrics read from the daemon at scrape time."""

    def job_readings(self) -> list[JobReading]: ...

    def host_readings(self) -> list[HostReading]: ...

    def shard_of(self, job: str, attempt: int) -> int | None:
        """The shard an attempt ran (GATHER for the gather step); None when unsharded or unknown."""
        ...

    def alert_counts(self) -> AlertCounts:
        """What became of the alerts decided so far: queued, suppressed, dropped, failed."""
        ...


class Metrics:
    """The daemon's metrics registry; subscribe `on_events` to the bus, pass `records_seen`
    to the runners, run `measure_loop_lag` as a task, serve `render()`."""

    def __init__(self, source: MetricsSource) -> None:
        self.source = source
        self.started = time.time()
        self.registry = CollectorRegistry(auto_describe=False)
        self.failures = Counter("supervise_job_failures", "Failures the probes recognised in a job's log, by kind",
                                ["job", "kind"], registry=self.registry)
        self.verdicts = Counter("supervise_job_verdicts", "Verdicts the watchdog recorded on a job's attempts",
                                ["job", "verdict"], registry=self.registry)
        self.launches = Counter("supervise_job_launches", "Attempts launched by this daemon (relaunches included)",
                                ["job"], registry=self.registry)
        self.records = Counter("supervise_probe_records", "Log records (lines and progress redraws) read and run through the probes",
                               ["job"], registry=self.registry)
        self.loop_lag = Histogram("supervise_event_loop_lag_seconds",
                                  "How late the daemon's event loop woke from a timed sleep", buckets=LAG_BUCKETS,
                                  registry=self.registry)
        shard = ["job", "shard"]
        self.shard_failures = Counter("supervise_shard_failures", "Failures the probes recognised in a shard's log, by kind",
                                      [*shard, "kind"], registry=self.registry)
        self.shard_verdicts = Counter("supervise_shard_verdicts", "Verdicts the watchdog recorded on a shard's attempts",
                                      [*shard, "verdict"], registry=self.registry)
        self.shard_launches = Counter("supervise_shard_launches", "A shard's attempts launched by this daemon",
                                      shard, registry=self.registry)
        self.gpu_faults = Counter("supervise_gpu_faults", "GPU faults NVML reported: Xid errors, uncorrected ECC "
                                  "errors, pages pending, failed remaps, hardware slowdowns",
                                  ["host", "gpu", "kind", "xid"], registry=self.registry)
        self.registry.register(_StateCollector(self))
        self._job_gpu: dict[tuple[str, str, int], int] = {}  # (job, host, gpu) -> bytes
        self._job_gpu_at = 0.0
        self._refresh_lock = asyncio.Lock()

    # -- inputs ------------------------------------------------------------------------

    def on_events(self, events: list[Event]) -> None:
        for event in events:
            if event.kind is EventKind.FAILURE:
                kind = event.failure.kind if event.failure else FailureKind.OTHER
                self.failures.labels(event.job, kind.value).inc()
                if (shard := self._shard(event)) is not None:
                    self.shard_failures.labels(event.job, shard, kind.value).inc()
            elif event.kind is EventKind.VERDICT:
                said = VerdictData.of(event).verdict
                verdict = said.value if said is not None else "unknown"
                self.verdicts.labels(event.job, verdict).inc()
                if (shard := self._shard(event)) is not None:
                    self.shard_verdicts.labels(event.job, shard, verdict).inc()
            elif event.kind is EventKind.LAUNCHED:
                self.launches.labels(event.job).inc()
                self.records.labels(event.job)  # the series exists (at 0) from launch on
                if (shard := self._shard(event)) is not None:
                    self.shard_launches.labels(event.job, shard).inc()

    def _shard(self, event: Event) -> str | None:
        """The `shard` label of the attempt an event belongs to; None for an unsharded job's."""
        shard = self.source.shard_of(event.job, event.attempt)
        return None if shard is None else shard_label(shard)

    def records_seen(self, job: str, n: int) -> None:
        self.records.labels(job).inc(n)

    async def measure_loop_lag(self, interval_s: float) -> None:
        """Sleep `interval_s` again and again; how much later than asked it wakes is the lag."""
        loop = asyncio.get_running_loop()
        while True:
            start = loop.time()
            await asyncio.sleep(interval_s)
            self.loop_lag.observe(max(0.0, loop.time() - start - interval_s))

    # -- output ------------------------------------------------------------------------

    async def render(self) -> bytes:
        await self.refresh()
        return generate_latest(self.registry)

    async def refresh(self) -> None:
        """Recompute what needs awaiting before a scrape: GPU memory per job."""
        async with self._refresh_lock:
            if time.monotonic() - self._job_gpu_at < _ATTRIBUTION_TTL_S:
                return
            try:
                self._job_gpu = await asyncio.wait_for(self._attribute_gpu_memory(), _ATTRIBUTION_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - a scrape must not fail for this (timeouts included)
                log.warning("per-job GPU memory not attributed", error=repr(exc))
            self._job_gpu_at = time.monotonic()

    async def _attribute_gpu_memory(self) -> dict[tuple[str, str, int], int]:
        result: dict[tuple[str, str, int], int] = {}
        jobs = self.source.job_readings()
        for reading in self.source.host_readings():
            sample = reading.gpu
            if sample is None or not sample.available or not sample.processes:
                continue
            for job in jobs:
                if job.job.host != reading.name:
                    continue
                pids = await _job_pids(job, reading.host)
                for proc in sample.processes:
                    if proc.pid in pids and proc.used_mib:
                        key = (job.job.name, reading.name, proc.gpu_index)
                        result[key] = result.get(key, 0) + proc.used_mib * MIB
        return result


async def _job_pids(job: JobReading, host: Host) -> set[int]:
    row = job.latest
    if row is None or row.pid is None:
        return set()
    handle = ProcessHandle(pid=row.pid, start_time=row.start_time, pgid=row.pgid or row.pid, tag=row.tag,
                           log_path=row.log_path, status_path=row.status_path, scheduler_id=row.scheduler_id)
    pids = set(await host.attempt_pids(handle))
    if job.runner is not None and job.runner.attempt == row.n:
        pids |= job.runner.known_pids
    return pids


class _StateCollector(Collector):
    """Gauges computed from the daemon's state at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        source = self.metrics.source
        info = InfoMetricFamily("supervise_daemon", "The daemon serving these metrics")
        info.add_metric([], {"version": __version__})
        yield info
        started = GaugeMetricFamily("supervise_daemon_start_time_seconds", "When the daemon started (Unix time)")
        started.add_metric([], self.metrics.started)
        yield started
        readings = source.job_readings()
        yield from self._jobs(readings)
        yield from _shards(readings)
        yield from self._gpus(source.host_readings())
        yield from _alerts(source.alert_counts())

    def _jobs(self, jobs: list[JobReading]) -> Iterator[Metric]:
        f = _Families()
        attempts = f.gauge("supervise_job_attempts", "Attempts of the job so far (the latest attempt's number)", ["job"])
        max_attempts = f.gauge("supervise_job_max_attempts", "Attempts allowed per run by the job's restart policy", ["job"])
        state = f.gauge("supervise_job_state", "The job's state: 1 for the current one, 0 for the others", ["job", "state"])
        phase = f.gauge("supervise_job_phase", "The latest attempt's phase: 1 for the current one, 0 for the others",
                        ["job", "phase"])
        done = f.gauge("supervise_job_progress_done", "Items done by the active progress bar of the latest attempt",
                       ["job", "probe"])
        expected = f.gauge("supervise_job_progress_expected", "Items the active progress bar counts to (its total)",
                           ["job", "probe"])
        per_item = f.gauge("supervise_job_progress_seconds_per_item", "Median seconds per item of the active progress bar",
                           ["job", "probe"])
        eta = f.gauge("supervise_job_progress_eta_seconds", "Estimated seconds until the active progress bar completes",
                      ["job", "probe"])
        stall = f.gauge("supervise_job_stall_seconds",
                        "Seconds since the running attempt last moved forward: its progress bar advanced or it entered a phase",
                        ["job"])
        output_age = f.gauge("supervise_job_last_output_age_seconds", "Seconds since the running attempt last wrote to its log",
                             ["job"])
        attempt_start = f.gauge("supervise_job_attempt_start_time_seconds", "When the latest attempt started (Unix time)", ["job"])
        cpu_s = f.gauge("supervise_job_attempt_cpu_seconds", "CPU seconds the latest ended attempt used (its cgroup)", ["job"])
        peak_memory = f.gauge("supervise_job_attempt_peak_memory_bytes",
                              "The most memory the latest ended attempt's cgroup held at once", ["job"])
        gpu_s = f.gauge("supervise_job_attempt_gpu_seconds",
                        "GPU-seconds of the latest ended attempt: GPUs its processes held x time (sampled)", ["job"])
        job_gpu = f.gauge("supervise_job_gpu_memory_used_bytes",
                          "GPU memory held by the processes of the job's latest attempt, per device", ["job", "host", "gpu"])
        now = time.time()
        for reading in jobs:
            job, row = reading.job, reading.latest
            attempts.add_metric([job.name], row.n if row else 0)
            max_attempts.add_metric([job.name], job.max_attempts)
            for name in JobState:
                state.add_metric([job.name, name.value], 1.0 if job.state is name else 0.0)
            if row is None:
                continue
            attempt_start.add_metric([job.name], row.started)
            if row.usage is not None:
                if row.usage.cpu_s is not None:
                    cpu_s.add_metric([job.name], row.usage.cpu_s)
                if row.usage.peak_memory_mib is not None:
                    peak_memory.add_metric([job.name], row.usage.peak_memory_mib * 1024.0 * 1024.0)
                if row.usage.gpu_s is not None:
                    gpu_s.add_metric([job.name], row.usage.gpu_s)
            # The runner's view counts only while it watches the latest attempt.
            live = reading.runner if reading.runner is not None and reading.runner.attempt == row.n else None
            current_phase = live.phase if live is not None and live.phase else row.phase
            for p in Phase:
                phase.add_metric([job.name, p.value], 1.0 if current_phase is p else 0.0)
            progress = _progress(row, live)
            if progress is not None:
                labels = [job.name, progress.probe]
                done.add_metric(labels, float(progress.done))
                if progress.total is not None:
                    expected.add_metric(labels, float(progress.total))
                if progress.rate_s_per_it is not None:
                    per_item.add_metric(labels, float(progress.rate_s_per_it))
                if progress.eta_s is not None:
                    eta.add_metric(labels, float(progress.eta_s))
            if live is not None:
                if live.still_for_s is not None:
                    stall.add_metric([job.name], live.still_for_s)
                if live.last_output is not None:
                    output_age.add_metric([job.name], max(0.0, now - live.last_output))
        for (job_name, host, gpu), used in sorted(self.metrics._job_gpu.items()):
            job_gpu.add_metric([job_name, host, str(gpu)], float(used))
        yield from f

    def _gpus(self, hosts: list[HostReading]) -> Iterator[Metric]:
        f = _Families()
        up = f.gauge("supervise_gpu_sampling_up", "1 when the host's GPUs could be read at the last sample", ["host"])
        used = f.gauge("supervise_gpu_memory_used_bytes", "GPU memory in use on the device (all processes)", ["host", "gpu"])
        total = f.gauge("supervise_gpu_memory_total_bytes", "GPU memory of the device", ["host", "gpu"])
        util = f.gauge("supervise_gpu_utilization_ratio", "GPU utilisation at the last sample (0 to 1)", ["host", "gpu"])
        for reading in hosts:
            sample, host_name = reading.gpu, reading.name
            if sample is None:
                continue
            up.add_metric([host_name], 1.0 if sample.available else 0.0)
            for device in sample.devices:
                labels = [host_name, str(device.index)]
                used.add_metric(labels, float(device.used_mib * MIB))
                total.add_metric(labels, float(device.total_mib * MIB))
                if device.util_pct is not None:
                    util.add_metric(labels, device.util_pct / 100.0)
        yield from f


def shard_label(shard: int) -> str:
    return "gather" if shard == GATHER else str(shard)


def _shards(jobs: list[JobReading]) -> Iterator[Metric]:
    """The `supervise_shard_*` gauges: each shard of each sharded job, labelled with its index."""
    f = _Families()
    state = f.gauge("supervise_shard_state", "The shard's state in the job's latest run: 1 for the current one, 0 for the others",
                    ["job", "shard", "state"])
    attempts = f.gauge("supervise_shard_attempts", "The shard's attempts in the job's latest run", ["job", "shard"])
    phase = f.gauge("supervise_shard_phase", "The shard's latest attempt's phase: 1 for the current one, 0 for the others",
                    ["job", "shard", "phase"])
    done = f.gauge("supervise_shard_progress_done", "Items done by the active progress bar of the shard's latest attempt",
                   ["job", "shard", "probe"])
    expected = f.gauge("supervise_shard_progress_expected", "Items the shard's active progress bar counts to (its total)",
                       ["job", "shard", "probe"])
    eta = f.gauge("supervise_shard_progress_eta_seconds", "Estimated seconds until the shard's active progress bar completes",
                  ["job", "shard", "probe"])
    stall = f.gauge("supervise_shard_stall_seconds", "Seconds since the shard's running attempt last moved forward",
                    ["job", "shard"])
    for reading in jobs:
        snapshots = {s.shard: s for s in reading.runner.shards} if reading.runner is not None else {}
        for shard in reading.shards:
            labels = [reading.job.name, shard_label(shard.shard)]
            attempts.add_metric(labels, float(len(shard.rows)))
            for s in JobState:
                state.add_metric([*labels, s.value], 1.0 if shard.state is s else 0.0)
            row = shard.latest
            if row is None:
                continue
            snap = snapshots.get(shard.shard)
            live = snap if snap is not None and snap.attempt == row.n else None
            current = live.phase if live is not None and live.phase else row.phase
            for p in Phase:
                phase.add_metric([*labels, p.value], 1.0 if current is p else 0.0)
            if (progress := _progress(row, live)) is not None:
                done.add_metric([*labels, progress.probe], float(progress.done))
                if progress.total is not None:
                    expected.add_metric([*labels, progress.probe], float(progress.total))
                if progress.eta_s is not None:
                    eta.add_metric([*labels, progress.probe], float(progress.eta_s))
            if live is not None and live.still_for_s is not None:
                stall.add_metric(labels, live.still_for_s)
    yield from f


class _Families:
    """Gauge families in declaration order; iterating yields them."""

    def __init__(self) -> None:
        self._families: list[GaugeMetricFamily] = []

    def gauge(self, name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, documentation, labels=labels)
        self._families.append(family)
        return family

    def __iter__(self) -> Iterator[Metric]:
        return iter(self._families)


def _progress(row: AttemptRow, live: RunnerSnapshot | None) -> BarProgress | None:
    """The runner's reading of the active bar, else the latest one stored."""
    if live is not None and live.progress is not None:
        return live.progress
    return row.progress


async def serve_tcp(metrics: Metrics, host: str, port: int) -> Any:
    """The opt-in TCP endpoint: an app with `/metrics` only (never the control API).
    Returns the aiohttp runner to clean up, or None when the address cannot be bound."""
    from aiohttp import web

    async def handle(request: web.Request) -> web.StreamResponse:
        return web.Response(body=await metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        log.error("metrics endpoint not started: cannot bind", addr=f"{host}:{port}", error=exc.strerror or str(exc))
        with contextlib.suppress(Exception):
            await runner.cleanup()
        return None
    log.info("metrics endpoint listening", url=f"http://{host if ':' not in host else '[' + host + ']'}:{port}/metrics")
    return runner


def _alerts(counts: AlertCounts) -> Iterator[Metric]:
    # Counters of the alerter's own (it counts from the daemon's start): exposed as they stand.
    queued = GaugeMetricFamily("supervise_alerts_queued", "Alerts waiting for delivery")
    queued.add_metric([], counts.queued)
    yield queued
    for name, help_text, value in (
            ("supervise_alerts_suppressed_total", "Alerts not sent: a repeat of one sent within the interval, or a burst",
             counts.suppressed),
            ("supervise_alerts_dropped_total", "Alerts never delivered: the delivery queue was full, or the daemon stopped",
             counts.dropped),
            ("supervise_alerts_failed_total", "Alert deliveries that failed or took longer than their timeout",
             counts.failed)):
        family = CounterMetricFamily(name.removesuffix("_total"), help_text)
        family.add_metric([], value)
        yield family
