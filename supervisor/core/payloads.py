"""What an event carries beside its message: one typed payload per event kind.

``Event.data`` is the payload's JSON form, exactly as the store keeps it and the API and
``events --json`` show it: producers build a payload here and store ``to_json()``; readers read
it back with the kind's ``of(event)``, never by key.  Reading is lenient, because the rows read
may have been written by any earlier version: a missing key reads as absent, a key this version
does not know is ignored, and a value of the wrong type or an unknown enum value reads as
absent too (``None``), never as an error.

A probe event's payload is the probe's named captures (``ProbeFields``): their names are the
probe packs', so they stay a mapping, read through the few typed views the supervisor itself
uses (``progress``, ``phase``, ``heartbeat``); a count is read as ``core/progress.py`` reads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple, Protocol, TypeVar

from supervisor.core.events import EventKind, JobState, Phase, Verdict
from supervisor.core.progress import Progress, count


class Carries(Protocol):
    """Anything with an event's data: a stored ``Event``, the API's ``EventInfo``."""

    @property
    def data(self) -> Mapping[str, Any]: ...


class Payload(Protocol):
    def to_json(self) -> dict[str, Any]: ...


_PLAIN = frozenset({str, int, float, bool, type(None)})


def _plain(fields: dict[Any, Any]) -> bool:
    """Every key a string and every value a JSON scalar (a loop: no generator made per line)."""
    for key, value in fields.items():  # noqa: SIM110 - all() over a generator costs a frame per line
        if type(key) is not str or type(value) not in _PLAIN:
            return False
    return True


def jsonable(value: Any) -> Any:
    """``value`` as JSON can hold it: tuples as lists, keys as strings, anything else as its text."""
    if type(value) is dict and _plain(value):
        return value  # a probe's fields, as they nearly always are: nothing to convert (one look per event)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)

_E = TypeVar("_E", bound=StrEnum)
_new = tuple.__new__  # a named tuple made without its Python-level __new__ (see ProbeFields)


# -- lenient readers of one stored value ----------------------------------------------------

def _number(value: object) -> float | None:
    return None if isinstance(value, bool) or not isinstance(value, int | float) else float(value)


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _bool(value: object) -> bool | None:
    return value if isinstance(value, bool) else None


def _list(value: object) -> list[Any] | None:
    return list(value) if isinstance(value, list) else None


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _member(kind: type[_E], value: object) -> _E | None:
    """``value`` as a member of ``kind``; None for one this version does not know."""
    if not isinstance(value, str):
        return None
    try:
        return kind(value)
    except ValueError:
        return None


def _present(**values: Any) -> dict[str, Any]:
    """The keys whose value is set: a payload stores only what its producer said."""
    return {key: value for key, value in values.items() if value is not None}


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
    def from_json(cls, data: Mapping[str, Any]) -> ProbeFields:
        return _new(cls, (data,))

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
        return None if value is None else _member(Phase, value)  # most lines name none: no call for them

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

@dataclass(frozen=True, slots=True)
class LaunchedData:
    pid: int | None
    argv: list[str]
    log: str | None
    host: str | None
    scheduler_id: str | None = None

    @classmethod
    def of(cls, event: Carries) -> LaunchedData:
        return cls.from_json(event.data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LaunchedData:
        argv = _list(data.get("argv")) or []
        return cls(_int(data.get("pid")), [str(a) for a in argv], _text(data.get("log")), _text(data.get("host")),
                   _text(data.get("scheduler_id")))

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "argv": list(self.argv), "log": self.log, "host": self.host,
                "scheduler_id": self.scheduler_id}


@dataclass(frozen=True, slots=True)
class ExitedData:
    returncode: int | None
    signal: int | None

    @classmethod
    def of(cls, event: Carries) -> ExitedData:
        return cls.from_json(event.data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ExitedData:
        return cls(_int(data.get("returncode")), _int(data.get("signal")))

    def to_json(self) -> dict[str, Any]:
        return {"returncode": self.returncode, "signal": self.signal}


@dataclass(frozen=True, slots=True)
class VerdictData:
    """The watchdog's judgement: its verdict, and the evidence its rule gave (each rule its own)."""

    verdict: Verdict | None  # None: a verdict this version does not know
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, event: Carries) -> VerdictData:
        return cls.from_json(event.data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VerdictData:
        return cls(_member(Verdict, data.get("verdict")), {k: v for k, v in data.items() if k != "verdict"})

    def to_json(self) -> dict[str, Any]:
        return {"verdict": None if self.verdict is None else self.verdict.value, **jsonable(dict(self.evidence))}


def _str_map(value: object) -> dict[str, str] | None:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else None


@dataclass(frozen=True, slots=True)
class SlowStep:
    """A step well over what earlier attempts took (the watchdog's ``slow``): the evidence its
    alert and its action event carry."""

    probe: str | None
    bar: str | None
    done: int | float | None
    total: int | float | None
    step_s: float
    slow_after_s: float
    history_p95_s: float
    stall_bound_s: float
    bound_source: str | None
    phase: str | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SlowStep:
        def seconds(key: str) -> float:
            return _number(data.get(key)) or 0.0

        return cls(_text(data.get("probe")), _text(data.get("bar")), count(data.get("done")), count(data.get("total")),
                   seconds("step_s"), seconds("slow_after_s"), seconds("history_p95_s"), seconds("stall_bound_s"),
                   _text(data.get("bound_source")), _text(data.get("phase")))

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "bar": self.bar, "done": self.done, "total": self.total, "step_s": self.step_s,
                "slow_after_s": self.slow_after_s, "history_p95_s": self.history_p95_s,
                "stall_bound_s": self.stall_bound_s, "bound_source": self.bound_source, "phase": self.phase}


@dataclass(frozen=True, slots=True)
class ActionData:
    """What the supervisor did, with the figures of what it did; only those set are stored
    (a kill its report, a hold whether it is held, a wake-up which sample woke it...)."""

    reason: str | None = None  # a batch scheduler's reason for keeping the job queued
    held: bool | None = None
    slow: SlowStep | None = None
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

    @classmethod
    def of(cls, event: Carries) -> ActionData:
        return cls.from_json(event.data)

    @property
    def is_kill(self) -> bool:
        """Processes were signalled here (an unhealthy attempt's tree, a stop, an unwatched
        attempt): every kill stores its report, and nothing else does."""
        return self.terminated is not None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ActionData:
        return cls(reason=_text(data.get("reason")), held=_bool(data.get("held")),
                   slow=SlowStep.from_json(data) if data.get("slow") is True else None,
                   down_s=_number(data.get("down_s")), error=_text(data.get("error")),
                   events_per_attempt=_int(data.get("events_per_attempt")),
                   terminated=_list(data.get("terminated")), killed=_list(data.get("killed")),
                   survivors=_list(data.get("survivors")), reparented=_list(data.get("reparented")),
                   released=_bool(data.get("released")), woken_by=_text(data.get("woken_by")),
                   sample_ts=_number(data.get("sample_ts")), waited_s=_number(data.get("waited_s")),
                   moved_from=_text(data.get("moved_from")), moved_to=_text(data.get("moved_to")),
                   left_out=_list(data.get("left_out")), until=_number(data.get("until")),
                   checkpoint=_text(data.get("checkpoint")), params=_str_map(data.get("params")))

    def to_json(self) -> dict[str, Any]:
        slow = {"slow": True, **self.slow.to_json()} if self.slow is not None else {}
        data: dict[str, Any] = jsonable({**_present(reason=self.reason, held=self.held), **slow, **_present(
            down_s=self.down_s, error=self.error, events_per_attempt=self.events_per_attempt,
            terminated=self.terminated, killed=self.killed, survivors=self.survivors, reparented=self.reparented,
            released=self.released, woken_by=self.woken_by, sample_ts=self.sample_ts, waited_s=self.waited_s,
            moved_from=self.moved_from, moved_to=self.moved_to, left_out=self.left_out, until=self.until,
            checkpoint=self.checkpoint, params=self.params)})
        return data


@dataclass(frozen=True, slots=True)
class AlertData:
    """An alert that was sent: its kind and severity, evidence and what comes next; or a probe
    pack switched off (``pack``, ``reason``)."""

    kind: str | None = None
    severity: str | None = None
    evidence: str | None = None
    next: str | None = None
    pack: str | None = None
    reason: str | None = None

    @classmethod
    def of(cls, event: Carries) -> AlertData:
        return cls.from_json(event.data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AlertData:
        return cls(*(_text(data.get(key)) for key in ("kind", "severity", "evidence", "next", "pack", "reason")))

    def to_json(self) -> dict[str, Any]:
        return _present(kind=self.kind, severity=self.severity, evidence=self.evidence, next=self.next,
                        pack=self.pack, reason=self.reason)


@dataclass(frozen=True, slots=True)
class RestartData:
    """A daemon restart that re-adopted the attempt: how long it went unwatched."""

    down_s: float | None
    down_since: float | None
    pid: int | None

    @classmethod
    def of(cls, event: Carries) -> RestartData:
        return cls.from_json(event.data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RestartData:
        return cls(_number(data.get("down_s")), _number(data.get("down_since")), _int(data.get("pid")))

    def to_json(self) -> dict[str, Any]:
        return {"down_s": self.down_s, "down_since": self.down_since, "pid": self.pid}


@dataclass(frozen=True, slots=True)
class GpuHolder:
    """A process of someone else's holding GPU memory the launch waits for."""

    pid: int | None
    gpu: int | None
    used_mib: int | None
    command: str | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuHolder:
        return cls(_int(data.get("pid")), _int(data.get("gpu")), _int(data.get("used_mib")), _text(data.get("command")))

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "gpu": self.gpu, "used_mib": self.used_mib, "command": self.command}


@dataclass(frozen=True, slots=True)
class GpuWaitData:
    holders: tuple[GpuHolder, ...]

    @classmethod
    def of(cls, event: Carries) -> GpuWaitData:
        return cls.from_json(event.data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuWaitData:
        return cls(tuple(GpuHolder.from_json(h) for h in _list(data.get("holders")) or [] if isinstance(h, Mapping)))

    def to_json(self) -> dict[str, Any]:
        return {"holders": [h.to_json() for h in self.holders]}


@dataclass(frozen=True, slots=True)
class GpuFaultData:
    gpu: int | None
    kind: str | None  # gpu.health's FaultKind: xid, ecc, retired pages, slowdown
    xid: int | None
    detail: str | None

    @classmethod
    def of(cls, event: Carries) -> GpuFaultData:
        return cls.from_json(event.data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuFaultData:
        return cls(_int(data.get("gpu")), _text(data.get("kind")), _int(data.get("xid")), _text(data.get("detail")))

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "kind": self.kind, "xid": self.xid, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class ProcessStackData:
    pid: int | None
    name: str | None
    stack: str | None
    error: str | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProcessStackData:
        return cls(_int(data.get("pid")), _text(data.get("name")), _text(data.get("stack")), _text(data.get("error")))

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "name": self.name, "stack": self.stack, "error": self.error}


@dataclass(frozen=True, slots=True)
class StacksData:
    """The Python stacks of an attempt's processes (``note``: why there are none)."""

    note: str
    processes: tuple[ProcessStackData, ...]
    left_out: int = 0  # the attempt's processes not dumped (past the cap on how many are)
    flight_recorder: str = ""  # a torch distributed job's flight recorder, in one line: which rank is behind
    dumps: tuple[str, ...] = ()  # its ranks' flight recorder dump files
    gpu_report: str = ""  # where `nvidia-smi -q` taken at the verdict went, or why it was not

    @classmethod
    def of(cls, event: Carries) -> StacksData:
        return cls.from_json(event.data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StacksData:
        processes = _list(data.get("processes")) or []
        dumps = _list(data.get("dumps")) or []
        return cls(_text(data.get("note")) or "",
                   tuple(ProcessStackData.from_json(p) for p in processes if isinstance(p, Mapping)),
                   _int(data.get("left_out")) or 0, _text(data.get("flight_recorder")) or "",
                   tuple(d for d in dumps if isinstance(d, str)), _text(data.get("gpu_report")) or "")

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"note": self.note, "processes": [p.to_json() for p in self.processes]}
        if self.left_out:  # said only where processes were left out: a whole dump's payload is as it was
            shown["left_out"] = self.left_out
        if self.flight_recorder:  # likewise: only a torch distributed job's dump says these
            shown["flight_recorder"] = self.flight_recorder
            shown["dumps"] = list(self.dumps)
        if self.gpu_report:
            shown["gpu_report"] = self.gpu_report
        return shown


@dataclass(frozen=True, slots=True)
class StateData:
    """The job's new state and why."""

    state: JobState | None  # None: a state this version does not know
    reason: str = ""

    @classmethod
    def of(cls, event: Carries) -> StateData:
        return cls.from_json(event.data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateData:
        return cls(_member(JobState, data.get("state")), _text(data.get("reason")) or "")

    def to_json(self) -> dict[str, Any]:
        return {"state": None if self.state is None else self.state.value, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class StragglerData:
    """A process whose bar is well behind its peers' (the watchdog's ``Straggler``), with where
    it runs as far as the daemon could tell (None where it could not)."""

    probe: str | None
    bar: str | None
    process: str | None  # as its lines' prefix named it: "rank=1", "default1"
    done: int | float | None
    total: int | float | None
    step_s: float | None  # its latest step's time per item
    rate_s: float | None  # its own median time per item
    peers_rate_s: float | None  # the median of its peers'
    peers: int | None
    factor: float | None
    steps: int | None
    pid: int | None = None
    host: str | None = None
    gpu: int | None = None  # the device index its process holds memory on, from NVML

    @classmethod
    def of(cls, event: Carries) -> StragglerData:
        return cls.from_json(event.data)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StragglerData:
        return cls(_text(data.get("probe")), _text(data.get("bar")), _text(data.get("process")),
                   count(data.get("done")), count(data.get("total")), _number(data.get("step_s")),
                   _number(data.get("rate_s")), _number(data.get("peers_rate_s")), _int(data.get("peers")),
                   _number(data.get("factor")), _int(data.get("steps")), _int(data.get("pid")),
                   _text(data.get("host")), _int(data.get("gpu")))

    def to_json(self) -> dict[str, Any]:
        return {"probe": self.probe, "bar": self.bar, "process": self.process, "done": self.done, "total": self.total,
                "step_s": self.step_s, "rate_s": self.rate_s, "peers_rate_s": self.peers_rate_s, "peers": self.peers,
                "factor": self.factor, "steps": self.steps, "pid": self.pid, "host": self.host, "gpu": self.gpu}


@dataclass(frozen=True, slots=True)
class UntypedData:
    """A kind no producer of this version writes (``gpu``): kept as it was stored."""

    fields: Mapping[str, Any]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> UntypedData:
        return cls(data)

    def to_json(self) -> dict[str, Any]:
        return dict(self.fields)


@dataclass(frozen=True, slots=True)
class DiskLowData:
    """The watched folder's free space fell under a bound of ``[disk]``, and what was done."""

    path: str | None
    free_mib: int | None
    total_mib: int | None
    warn_free_mib: int | None
    min_free_mib: int | None
    action: str | None  # "warned", "held", "stopped"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DiskLowData:
        return cls(_text(data.get("path")), _int(data.get("free_mib")), _int(data.get("total_mib")),
                   _int(data.get("warn_free_mib")), _int(data.get("min_free_mib")), _text(data.get("action")))

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "free_mib": self.free_mib, "total_mib": self.total_mib,
                "warn_free_mib": self.warn_free_mib, "min_free_mib": self.min_free_mib, "action": self.action}


AnyPayload = (ProbeFields | LaunchedData | ExitedData | VerdictData | ActionData | AlertData | RestartData
              | GpuWaitData | GpuFaultData | StacksData | StateData | StragglerData | DiskLowData | UntypedData)

_BY_KIND: dict[EventKind, Any] = {
    EventKind.PHASE: ProbeFields, EventKind.PROGRESS: ProbeFields, EventKind.FAILURE: ProbeFields,
    EventKind.METRIC: ProbeFields, EventKind.INFO: ProbeFields,
    EventKind.LAUNCHED: LaunchedData, EventKind.EXITED: ExitedData, EventKind.VERDICT: VerdictData,
    EventKind.ACTION: ActionData, EventKind.GPU: UntypedData, EventKind.ALERT: AlertData,
    EventKind.DAEMON_RESTARTED: RestartData, EventKind.GPU_WAIT: GpuWaitData, EventKind.GPU_FAULT: GpuFaultData,
    EventKind.STRAGGLER: StragglerData, EventKind.DISK_LOW: DiskLowData,
    EventKind.STACKS: StacksData, EventKind.STATE: StateData,
}


def payload_of(kind: EventKind, data: Mapping[str, Any]) -> AnyPayload:
    """The typed payload of an event of ``kind`` stored as ``data``."""
    reader: Any = _BY_KIND[kind]
    payload: AnyPayload = reader.from_json(_mapping(data))
    return payload
