"""What an event carries beside its message: one typed payload per event kind.

``Event.data`` is the payload's JSON form, exactly as the store keeps it and the API and
``events --json`` show it: producers build a payload here and store ``to_json()``; readers read
it back with the kind's ``of(event)`` (or ``payload_of(event)``, by the event's kind), never by
key: a dict of data is met only where events are stored and sent.  Each payload is a dataclass
whose codec ``@carried_by`` derives from its fields (``core/payload_codec.py``), registering it
as what its kinds' events carry.  Reading is lenient, because the rows read may have been
written by any earlier version: a missing key reads as absent, a key this version does not know
is ignored, and a value of the wrong type or an unknown enum value reads as absent too
(``None``), never as an error.

A probe event's payload is the probe's named captures (``ProbeFields``): their names are the
probe packs', so they stay a mapping, read through the few typed views the supervisor itself
uses (``progress``, ``phase``, ``heartbeat``); a count is read as ``core/progress.py`` reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, NamedTuple, Protocol, overload

from supervisor.core.events import EventKind, JobState, Phase, ProbeKind, Verdict
from supervisor.core.payload_codec import (
    REGISTRY,
    REST,
    Carries,
    Flagged,
    Omit,
    Read,
    ShownWith,
    StoredPayload,
    carried_by,
    member,
    register,
    texts,
)
from supervisor.core.payload_codec import jsonable as jsonable  # producers' one import for their payloads
from supervisor.core.progress import Progress, count


class Payload(Protocol):
    def to_json(self) -> dict[str, Any]: ...


_new = tuple.__new__  # a named tuple made without its Python-level __new__ (see ProbeFields)


# Figures a progress line may print beside its count, shown by `logs --events`.
_FIGURES = ("tok_s", "loss", "rate")


class ProbeFields(NamedTuple):
    """A probe event's payload (phase, progress, failure, metric, info): the probe's captures.
    A named tuple: one is read for every probe event, by the watchdog and by the store."""

    fields: Mapping[str, Any]

    @classmethod
    def of(cls, event: Carries) -> ProbeFields:
        return _new(cls, (event.data,))

    @classmethod
    def from_json(cls, data: object) -> ProbeFields:
        return _new(cls, (data if type(data) is dict or isinstance(data, Mapping) else {},))

    def to_json(self) -> dict[str, Any]:
        fields = self.fields
        # The captures' own dict when they are one (the engine's, made for this event): no copy per line.
        return fields if type(fields) is dict else dict(fields)

    @property
    def progress(self) -> Progress | None:
        return Progress.read(self.fields)

    @property
    def phase(self) -> Phase | None:
        """The phase a line implies by a ``phase`` field (a progress bar known to belong to one)."""
        value = self.fields.get("phase")
        return None if value is None else member(Phase, value)  # most lines name none: no call for them

    @property
    def heartbeat(self) -> bool:
        """A "still waiting" line: output, but no sign of work."""
        return bool(self.fields.get("heartbeat"))

    @property
    def paused(self) -> bool:
        """A "still waiting" line that says the program waits by design on something outside it (a
        pipeline's other step): its bars are not stalled while such lines keep coming."""
        return bool(self.fields.get("paused"))

    def figures(self) -> list[tuple[str, Any]]:
        """The figures printed beside a count (tokens/s, loss, rate), as captured."""
        return [(name, self.fields[name]) for name in _FIGURES if name in self.fields]


# -- the supervisor's own events ---------------------------------------------------------------


@carried_by(EventKind.LAUNCHED)
@dataclass(frozen=True, slots=True)
class LaunchedData(StoredPayload):
    pid: int | None
    argv: Annotated[list[str], Read(texts)]
    log: str | None
    host: str | None
    scheduler_id: str | None = None


@carried_by(EventKind.EXITED)
@dataclass(frozen=True, slots=True)
class ExitedData(StoredPayload):
    returncode: int | None
    signal: int | None


@carried_by(EventKind.VERDICT)
@dataclass(frozen=True, slots=True)
class VerdictData(StoredPayload):
    """The watchdog's judgement: its verdict, and the evidence its rule gave (each rule its own)."""

    verdict: Verdict | None  # None: a verdict this version does not know
    evidence: Annotated[Mapping[str, Any], REST] = field(default_factory=dict)


@carried_by()
@dataclass(frozen=True, slots=True)
class SlowStep(StoredPayload):
    """A step well over what earlier attempts took (the watchdog's ``slow``): the evidence its
    alert and its action event carry."""

    probe: str | None
    bar: str | None
    done: Annotated[int | float | None, Read(count)]
    total: Annotated[int | float | None, Read(count)]
    step_s: float
    slow_after_s: float
    history_p95_s: float
    stall_bound_s: float
    bound_source: str | None
    phase: str | None


@carried_by(EventKind.ACTION)
@dataclass(frozen=True, slots=True)
class ActionData(StoredPayload):
    """What the supervisor did, with the figures of what it did; only those set are stored
    (a kill its report, a hold whether it is held, a wake-up which sample woke it...)."""

    omit: ClassVar[Omit | None] = Omit.NONE

    reason: str | None = None  # a batch scheduler's reason for keeping the job queued
    held: bool | None = None
    slow: Annotated[SlowStep | None, Flagged("slow")] = None
    down_s: float | None = None  # how long the host was unreachable
    error: str | None = None
    events_per_attempt: int | None = None
    terminated: list[Any] | None = None  # the kill report: (pid, name) pairs, or pids
    killed: list[Any] | None = None
    survivors: list[Any] | None = None
    reparented: list[Any] | None = None
    released: bool | None = None  # GPU memory released after the kill
    woken_by: str | None = None  # what ended a wait for GPUs
    sample_ts: float | None = None
    waited_s: float | None = None
    moved_from: str | None = None  # a job with a host pool moved away from this host (jobs/quarantine.py)
    moved_to: str | None = None
    left_out: list[int] | None = None  # quarantined GPUs left out of CUDA_VISIBLE_DEVICES at launch
    until: float | None = None  # when the quarantine that caused it ends (wall clock)
    checkpoint: str | None = None  # what an attempt starts from: its {last_checkpoint}
    params: dict[str, str] | None = None  # ... and its [params], where `[restart.adjust]` changed them

    @property
    def is_kill(self) -> bool:
        """Processes were signalled here (an unhealthy attempt's tree, a stop, an unwatched
        attempt): every kill stores its report, and nothing else does."""
        return self.terminated is not None


@carried_by(EventKind.ALERT)
@dataclass(frozen=True, slots=True)
class AlertData(StoredPayload):
    """An alert that was sent: its kind and severity, evidence and what comes next; or a probe
    pack switched off (``pack``, ``reason``)."""

    omit: ClassVar[Omit | None] = Omit.NONE

    kind: str | None = None
    severity: str | None = None
    evidence: str | None = None
    next: str | None = None
    pack: str | None = None
    reason: str | None = None


@carried_by(EventKind.DAEMON_RESTARTED)
@dataclass(frozen=True, slots=True)
class RestartData(StoredPayload):
    """A daemon restart that re-adopted the attempt: how long it went unwatched."""

    down_s: float | None
    down_since: float | None
    pid: int | None


@carried_by()
@dataclass(frozen=True, slots=True)
class GpuHolder(StoredPayload):
    """A process of someone else's holding GPU memory the launch waits for."""

    pid: int | None
    gpu: int | None
    used_mib: int | None
    command: str | None


@carried_by(EventKind.GPU_WAIT)
@dataclass(frozen=True, slots=True)
class GpuWaitData(StoredPayload):
    holders: tuple[GpuHolder, ...]


@carried_by(EventKind.GPU_FAULT)
@dataclass(frozen=True, slots=True)
class GpuFaultData(StoredPayload):
    gpu: int | None
    kind: str | None  # gpu.health's FaultKind: xid, ecc, retired pages, slowdown
    xid: int | None
    detail: str | None


@carried_by()
@dataclass(frozen=True, slots=True)
class ProcessStackData(StoredPayload):
    pid: int | None
    name: str | None
    stack: str | None
    error: str | None


@carried_by(EventKind.STACKS)
@dataclass(frozen=True, slots=True)
class StacksData(StoredPayload):
    """The Python stacks of an attempt's processes (``note``: why there are none).  The fields
    after ``processes`` are stored only where set, so that a whole dump's payload is as it was."""

    note: str
    processes: tuple[ProcessStackData, ...]
    # the attempt's processes not dumped (past the cap on how many are)
    left_out: Annotated[int, Omit.EMPTY] = 0
    # a torch distributed job's flight recorder, in one line: which rank is behind ...
    flight_recorder: Annotated[str, Omit.EMPTY] = ""
    dumps: Annotated[tuple[str, ...], ShownWith("flight_recorder")] = ()  # ... and its ranks' dump files
    gpu_report: Annotated[str, Omit.EMPTY] = ""  # where `nvidia-smi -q` taken at the verdict went, or why it was not


@carried_by(EventKind.STATE)
@dataclass(frozen=True, slots=True)
class StateData(StoredPayload):
    """The job's new state and why."""

    state: JobState | None  # None: a state this version does not know
    reason: str = ""


@carried_by(EventKind.STRAGGLER)
@dataclass(frozen=True, slots=True)
class StragglerData(StoredPayload):
    """A process whose bar is well behind its peers' (the watchdog's ``Straggler``), with where
    it runs as far as the daemon could tell (None where it could not)."""

    probe: str | None
    bar: str | None
    process: str | None  # as its lines' prefix named it: "rank=1", "default1"
    done: Annotated[int | float | None, Read(count)]
    total: Annotated[int | float | None, Read(count)]
    step_s: float | None  # its latest step's time per item
    rate_s: float | None  # its own median time per item
    peers_rate_s: float | None  # the median of its peers'
    peers: int | None
    factor: float | None
    steps: int | None
    pid: int | None = None
    host: str | None = None
    gpu: int | None = None  # the device index its process holds memory on, from NVML


@carried_by(EventKind.GPU)
@dataclass(frozen=True, slots=True)
class UntypedData(StoredPayload):
    """A kind no producer of this version writes (``gpu``): kept as it was stored."""

    fields: Annotated[Mapping[str, Any], REST]


@carried_by(EventKind.DISK_LOW)
@dataclass(frozen=True, slots=True)
class DiskLowData(StoredPayload):
    """The watched folder's free space fell under a bound of ``[disk]``, and what was done."""

    path: str | None
    free_mib: int | None
    total_mib: int | None
    warn_free_mib: int | None
    min_free_mib: int | None
    action: str | None  # "warned", "held", "stopped"


register(ProbeFields, *(EventKind(kind) for kind in ProbeKind))  # the probe kinds are event kinds too

AnyPayload = (ProbeFields | LaunchedData | ExitedData | VerdictData | ActionData | AlertData | RestartData
              | GpuWaitData | GpuFaultData | StacksData | StateData | StragglerData | DiskLowData | UntypedData)

# Kinds whose events carry no payload (their data is stored and shown, never read): none today.
NO_PAYLOAD: frozenset[EventKind] = frozenset()


class _Kinded(Carries, Protocol):
    @property
    def kind(self) -> EventKind: ...


@overload
def payload_of(event: _Kinded, /) -> AnyPayload: ...


@overload
def payload_of(kind: EventKind, data: object, /) -> AnyPayload: ...


def payload_of(event_or_kind: _Kinded | EventKind, data: object = None, /) -> AnyPayload:
    """The typed payload of ``event`` (a stored event or the API's), or of one of ``kind`` stored as
    ``data``: the one reader of stored rows, by kind.  A kind's own class reads it too
    (``LaunchedData.of(event)``) where the kind is known."""
    if isinstance(event_or_kind, EventKind):
        kind = event_or_kind
    else:
        kind, data = event_or_kind.kind, event_or_kind.data
    payload: AnyPayload = REGISTRY[kind].from_json(data)
    return payload
