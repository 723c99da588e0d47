"""What each alert says: one composer per kind (``AlertKind``), and the per-attempt memory that
keeps milestone and ETA alerts to one each.

Every alert names the job and attempt, what happened, the evidence and what happens next
(relaunch in N s, killing in N s, nothing).  An incident's key names the job and what happened,
never the attempt: a crash loop is one incident, said once, its repeats counted.  Delivery, de-duplication of repeats (same key)
and the burst limit are ``alerts.Alerter``'s; this module only decides what to say and when
a milestone is due.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from supervisor.core.alert_routes import AlertKind
from supervisor.core.events import Failure, Phase
from supervisor.core.host_url import is_local
from supervisor.core.progress import Progress
from supervisor.gpu.health import GpuFault
from supervisor.notify.alerts import Alert
from supervisor.spec.tables import AlertSpec
from supervisor.watchdog import Judgement, ProgressState, fine_duration, format_duration, label, slow_step


@dataclass(frozen=True)
class Attempt:
    """Which attempt an alert is about, and what the daemon knows of it now."""

    job: str
    n: int
    gpu: str  # GPU memory per device, in words
    failure: Failure | None = None  # the attempt's root-cause failure, if one was logged
    stacks: str | None = None  # its processes' innermost frames, dumped before a kill


def _evidence(judgement: Judgement, failure: Failure | None, stacks: str | None = None) -> str:
    evidence = judgement.reason
    if failure is not None and failure.line:
        evidence += f" | {failure.line} (fingerprint {failure.fingerprint})"
    if stacks:
        evidence += f" | stacks: {stacks[:600]}"
    return evidence


def verdict(at: Attempt, judgement: Judgement, next_action: str) -> Alert:
    """An attempt ended unhealthy; ``next_action`` is what the policy does (relaunch in N s)."""
    value = judgement.verdict.value
    return Alert(job=at.job, attempt=at.n, title=f"{at.job}: attempt {at.n} {value}", what=value,
                 evidence=_evidence(judgement, at.failure, at.stacks), gpu=at.gpu, next_action=next_action,
                 key=f"{at.job}:verdict:{value}", kind=AlertKind.VERDICT)


def gave_up(at: Attempt, judgement: Judgement, why: str) -> Alert:
    """The job ends failed: its own title says why it is not relaunched ("same failure twice …")."""
    return Alert(job=at.job, attempt=at.n, title=f"{at.job}: gave up: {why}",
                 what=f"attempt {at.n} {judgement.verdict.value}; not relaunching",
                 evidence=_evidence(judgement, at.failure, at.stacks), gpu=at.gpu,
                 next_action=f"nothing: the job has failed; `supervise restart {at.job}` starts it again",
                 key=f"{at.job}:gave_up", kind=AlertKind.GAVE_UP)


def done(at: Attempt, judgement: Judgement, elapsed_s: float) -> Alert:
    return Alert(job=at.job, attempt=at.n, title=f"{at.job}: done",
                 what=f"attempt {at.n} finished after {format_duration(elapsed_s)}", evidence=judgement.reason,
                 gpu=at.gpu, next_action="nothing: the job is done", key=f"{at.job}:{at.n}:done", kind=AlertKind.DONE)


def warning(at: Attempt, judgement: Judgement, where: str, next_action: str) -> Alert:
    """Unhealthy while it runs, and not killed now: ``next_action`` says whether and when it will be."""
    value = judgement.verdict.value
    return Alert(job=at.job, attempt=at.n, title=f"{at.job}: {value} {where}; {next_action}",
                 what=f"{value} (attempt {at.n} still running)", evidence=_evidence(judgement, at.failure, at.stacks),
                 gpu=at.gpu, next_action=next_action, key=f"{at.job}:warning:{value}", kind=AlertKind.WARNING)


def recovered(at: Attempt, judgement: Judgement, where: str, kill_was_pending: bool) -> Alert:
    cancelled = "the pending kill is cancelled" if kill_was_pending else "no kill was pending"
    return Alert(job=at.job, attempt=at.n, title=f"{at.job}: moving again {where}; {cancelled}",
                 what=f"it moved again after: {judgement.reason}", evidence=judgement.reason, gpu=at.gpu,
                 next_action=f"nothing: {cancelled}, watching on", key=f"{at.job}:recovered",
                 kind=AlertKind.RECOVERED)


def unreachable(at: Attempt, host: str, error: str) -> Alert:
    """The attempt's host stopped answering: its process is not known to have ended."""
    return Alert(job=at.job, attempt=at.n, title=f"{at.job}: {host} unreachable; attempt {at.n} unwatched",
                 what=f"attempt {at.n} cannot be watched: {host} does not answer", evidence=error, gpu=at.gpu,
                 next_action="asking the host again with backoff; the attempt is re-adopted when it answers "
                             f"(`supervise stop {at.job}` gives up waiting)",
                 key=f"{at.job}:unreachable", kind=AlertKind.UNREACHABLE)


def gpu_fault(at: Attempt, host: str, fault: GpuFault) -> Alert:
    """A GPU the attempt uses reported a fault; a slowdown is a warning, anything else a failure."""
    where = "" if is_local(host) else f" on {host}"
    return Alert(job=at.job, attempt=at.n, title=f"{at.job}: GPU {fault.gpu}{where}: {fault.detail}",
                 what=f"a GPU attempt {at.n} uses reported a fault", evidence=fault.describe(), gpu=at.gpu,
                 next_action="nothing yet: the attempt runs on and is judged as usual; check the GPU "
                             "(`nvidia-smi -q -d ECC,PAGE_RETIREMENT,PERFORMANCE`) before the next run there",
                 key=f"{at.job}:gpu_fault:{fault.gpu}:{fault.kind.value}:{fault.xid}",
                 kind=AlertKind.GPU_FAULT if fault.serious else AlertKind.SLOW)


def reachable(at: Attempt, host: str, down_s: float) -> Alert:
    return Alert(job=at.job, attempt=at.n, title=f"{at.job}: {host} reachable again; attempt {at.n} re-adopted",
                 what=f"{host} answered after {format_duration(down_s)}", evidence=f"unreachable for {down_s:.0f} s",
                 gpu=at.gpu, next_action="nothing: watching on from where the log was read",
                 key=f"{at.job}:recovered", kind=AlertKind.RECOVERED)


def slow(at: Attempt, judgement: Judgement, where: str) -> Alert:
    """A bar's step takes well over what earlier attempts took: said before it becomes a stall."""
    step = slow_step(judgement.evidence)
    return Alert(job=at.job, attempt=at.n, title=f"{at.job}: slow {where}: step at {fine_duration(step.step_s)}, "
                 f"history p95 {fine_duration(step.history_p95_s)}",
                 what=f"slow (attempt {at.n} still running)", evidence=judgement.reason, gpu=at.gpu,
                 next_action=f"nothing yet: stalled if no step for {fine_duration(step.stall_bound_s)}",
                 key=f"{at.job}:slow:{step.bar}", kind=AlertKind.SLOW)


def straggler(at: Attempt, said: str, process: str, pid: int | None, stack: str | None) -> Alert:
    """One rank well behind its peers (a warning: never a kill by itself)."""
    evidence = said if stack is None else f"{said}\nstack: {stack}"
    return Alert(job=at.job, attempt=at.n, title=f"{at.job}: straggler {process}" + (f" (pid {pid})" if pid else ""),
                 what=f"straggler (attempt {at.n} still running)", evidence=evidence, gpu=at.gpu,
                 next_action="nothing: a warning; stalled only if it stops", key=f"{at.job}:straggler:{process}",
                 kind=AlertKind.SLOW)


def disk_low(at: Attempt, said: str, action: str, next_action: str) -> Alert:
    """The output folder's free space is low: a warning, or the attempt held or stopped for it."""
    return Alert(job=at.job, attempt=at.n, title=f"{at.job}: {said}", what=f"disk low (attempt {at.n}: {action})",
                 evidence=said, gpu=at.gpu, next_action=next_action, key=f"{at.job}:disk_low:{action}",
                 kind=AlertKind.WARNING)


def where(progress: ProgressState | None, phase: Phase | None) -> str:
    """Where the attempt stands, for a title: "at shard 12/64", "in phase weight_loading"."""
    if progress is not None and progress.total:
        return f"at {label(progress.probe)} {progress.done}/{progress.total}"
    return f"in phase {phase.value}" if phase is not None else "before any phase"


@dataclass(frozen=True)
class BarStep:
    """One progress step as read (a batch may hold many: each is judged for its marks)."""

    bar: str
    done: float
    total: float | None
    rate_s_per_it: float | None  # the bar's median so far

    @classmethod
    def of(cls, step: Progress | None, progress: ProgressState | None) -> BarStep | None:
        """``step``: the line's count; ``progress``: its bar as the watchdog tracks it."""
        if step is None or step.total is None or progress is None:
            return None
        done, total = step.done, step.total
        # The bar's description where it has one; else the probe's id without its pack's name.
        bar = progress.bar if progress.bar and progress.bar != progress.probe else progress.probe.rsplit(".", 1)[-1]
        return cls(bar, done, total, progress.rate)


@dataclass
class Milestones:
    """One attempt's milestone and ETA alerts: each phase once, each percentage mark once, an
    ETA at most every ``eta_every_s`` (the clock is the caller's, in seconds)."""

    spec: AlertSpec
    phases_sent: set[Phase] = field(default_factory=set)
    marks_sent: dict[str, set[int]] = field(default_factory=dict)
    last_eta_at: float | None = None

    def phase(self, at: Attempt, phase: Phase, elapsed_s: float) -> Alert | None:
        if phase not in self.spec.notify_phases or phase in self.phases_sent:
            return None
        self.phases_sent.add(phase)
        return Alert(job=at.job, attempt=at.n, title=f"{at.job}: {phase.value} after {format_duration(elapsed_s)}",
                     what=f"attempt {at.n} reached phase {phase.value}", evidence="", gpu=at.gpu,
                     next_action="nothing: watching on", key=f"{at.job}:{at.n}:phase:{phase.value}",
                     kind=AlertKind.PHASE)

    def progress(self, at: Attempt, step: BarStep, elapsed_s: float, now: float) -> Alert | None:
        if not step.total or step.done >= step.total:
            return None
        percent = 100.0 * step.done / step.total
        bar = step.bar
        sent = self.marks_sent.setdefault(bar, set())
        crossed = {m for m in self.spec.eta_at_percent if m <= percent} - sent
        periodic = self.spec.eta_every_s is not None and (
            self.last_eta_at is None or now - self.last_eta_at >= self.spec.eta_every_s)
        if not crossed and not periodic:
            return None
        sent |= crossed
        self.last_eta_at = now
        eta_s = None if step.rate_s_per_it is None else (step.total - step.done) * step.rate_s_per_it
        eta = f"ETA {format_duration(eta_s)}" if eta_s is not None else "no ETA yet"
        return Alert(job=at.job, attempt=at.n,
                     title=f"{at.job}: {bar}: {percent:.0f}% after {format_duration(elapsed_s)}, {eta}",
                     what=f"{bar} {step.done}/{step.total}", evidence="", gpu=at.gpu,
                     next_action="nothing: watching on", key=f"{at.job}:{at.n}:eta:{bar}:{percent:.0f}",
                     kind=AlertKind.ETA)
