"""The shared vocabulary: records read from a log, events probes derive from them, and
the events published on the bus.

Names here are canonical: probe packs, the store, the watchdog, alerts and tests all
use exactly these strings.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple


class Phase(StrEnum):
    """Canonical phases of a GPU job, in the order a healthy run goes through them."""

    STARTUP = "startup"
    CONFIG = "config"
    DISTRIBUTED_INIT = "distributed_init"
    MODEL_INIT = "model_init"
    WEIGHT_LOADING = "weight_loading"
    WEIGHTS_LOADED = "weights_loaded"
    KV_CACHE_PROFILE = "kv_cache_profile"
    CUDA_GRAPH_CAPTURE = "cuda_graph_capture"
    ENGINE_READY = "engine_ready"
    RUNNING = "running"
    DONE = "done"

    @property
    def rank(self) -> int:
        return _PHASE_RANK[self]  # asked for every phase event: a lookup, not a search


PHASE_ORDER: tuple[Phase, ...] = tuple(Phase)
_PHASE_RANK: dict[Phase, int] = {phase: rank for rank, phase in enumerate(PHASE_ORDER)}


class FailureKind(StrEnum):
    CUDA_OOM = "cuda_oom"
    NCCL = "nccl"
    DISTRIBUTED_TIMEOUT = "distributed_timeout"
    ASSERTION = "assertion"
    IMPORT_ERROR = "import_error"
    VALUE_ERROR = "value_error"
    RUNTIME_ERROR = "runtime_error"
    KEY_ERROR = "key_error"
    TYPE_ERROR = "type_error"
    ATTRIBUTE_ERROR = "attribute_error"
    NOT_IMPLEMENTED = "not_implemented"
    # A ValueError/KeyError/AssertionError/NotImplementedError raised during start-up: wrong
    # settings or code, not a broken box (so relaunching the same command will not help).
    CONFIG_ERROR = "config_error"
    # The command itself could not be found (the launch wrapper's own line, exit 127): relaunching
    # the same command cannot help.
    COMMAND_NOT_FOUND = "command_not_found"
    KILLED = "killed"
    OTHER = "other"


class Outcome(StrEnum):
    """What a finished log shows when replayed offline (`supervise probe`)."""

    READY = "ready"
    DONE = "done"
    CRASHED = "crashed"
    OOM = "oom"
    INCOMPLETE = "incomplete"


class ProbeKind(StrEnum):
    PHASE = "phase"
    PROGRESS = "progress"
    FAILURE = "failure"
    METRIC = "metric"
    INFO = "info"


class EventKind(StrEnum):
    """Kinds of event on the bus: the probe kinds plus the supervisor's own lifecycle events."""

    PHASE = "phase"
    PROGRESS = "progress"
    FAILURE = "failure"
    METRIC = "metric"
    INFO = "info"
    LAUNCHED = "launched"  # an attempt's process started
    EXITED = "exited"  # an attempt's process ended (exit code / signal)
    VERDICT = "verdict"  # the watchdog's judgement changed
    ACTION = "action"  # the policy did something (kill, wait for GPUs, relaunch, give up)
    GPU = "gpu"  # a GPU sample
    ALERT = "alert"  # an alert was sent
    DAEMON_RESTARTED = "daemon_restarted"  # a new daemon re-adopted the attempt (data: how long it went unwatched)
    GPU_WAIT = "gpu_wait"  # the launch waits for GPU memory other processes hold (data: the holders)
    GPU_FAULT = "gpu_fault"  # a fault on a GPU the attempt uses: Xid, ECC, pending retirement, slowdown
    STRAGGLER = "straggler"  # one rank's bar well behind its peers' (a warning, never a kill; data: which, how far)
    DISK_LOW = "disk_low"  # the output folder's free space under disk.warn_free_mib or min_free_mib (data: how much)
    STACKS = "stacks"  # the Python stacks of the attempt's processes, dumped before a kill (data: each process's)
    STATE = "state"  # the job's state changed (data: state, reason); numbered with the job's latest attempt


class BoundKind(StrEnum):
    """Where a progress bar's stall bound came from."""

    HISTORY = "history"  # earlier attempts' intervals of the same bar
    THIS_RUN = "this_run"  # k x this attempt's median interval
    DEFAULT_FLOOR = "default_floor"  # the spec's stall floor
    LEARNED_MIN = "learned_min"  # the spec's learned_min_s: history allowed under the floor, down to it
    FIRST_PROGRESS = "first_progress"  # the phase's first_progress_s, before any interval


class Verdict(StrEnum):
    HEALTHY = "healthy"
    STALLED = "stalled"
    SILENT = "silent"
    CRASHED = "crashed"
    OOM = "oom"
    # Ended by a SIGKILL the supervisor did not send, with no word from the kernel that it was
    # its OOM killer (cgroup memory.events, the kernel log): someone or something else killed it.
    KILLED = "killed"
    LEAKED = "leaked"
    DONE = "done"
    PREEMPTED = "preempted"  # a batch scheduler took it away (preemption, requeue, node failure)
    TIMEOUT = "timeout"  # a batch scheduler's time limit ended it
    HUNG = "hung"  # a serving engine up but doing no work: 0 tokens/s with requests running or waiting
    IDLE = "idle"  # GPUs at 0% utilisation and no progress for health.idle_s
    DIVERGED = "diverged"  # a training loss that became NaN/inf, or stays far above its median
    # failed after its own `[limits] tasks_max` refused a fork or a thread (pids.events): it needs more
    # tasks than its spec allows, which a relaunch would not change (its memory limit is `oom`)
    LIMIT = "limit"


# Log levels at which a program reports an error it means to survive.
SURVIVABLE_LEVELS = frozenset({"DEBUG", "INFO", "WARNING"})


@dataclass(frozen=True, slots=True)
class Failure:
    """A failure a probe read from a log: the one value carried from the probe engine to the
    watchdog, the store and the API."""

    kind: FailureKind
    line: str  # the record text with prefixes stripped (the final exception line for tracebacks)
    fingerprint: str | None = None  # what two occurrences of one bug share (type + message + frame)
    traceback: str | None = None  # the whole multi-line capture, when there was one
    level: str | None = None  # the log level it was logged at (DEBUG … CRITICAL), when the header says
    # Another failure's echo ("EngineCore failed to start.", torchrun's ChildFailedError): never
    # the attempt's failure while a root cause was seen (see probes' root_cause).
    consequence: bool = False
    # The program cannot do its work after it, whatever it prints next (vLLM's engine dead
    # behind an API server that still answers requests with errors): ``fatal = true`` probes.
    fatal: bool = False

    @property
    def survivable(self) -> bool:
        """Logged below ERROR: a program reporting an error it handled.  Never a fatal one, whatever
        its level (torchrun's agent warns that it got SIGTERM and shuts its workers down)."""
        return self.level in SURVIVABLE_LEVELS and not self.fatal

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": self.kind.value, "line": self.line, "fingerprint": self.fingerprint,
                "traceback": self.traceback, "level": self.level}
        # Only when set: the shape stored rows and API clients have always had otherwise.
        if self.consequence:
            data["consequence"] = True
        if self.fatal:
            data["fatal"] = True
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Failure:
        """Read back ``to_json()``'s shape; rows written before ``level`` existed lack it, and a
        kind this version does not know reads as ``other``."""
        return cls(kind=failure_kind(data.get("kind")), line=str(data.get("line") or ""),
                   fingerprint=data.get("fingerprint"), traceback=data.get("traceback"), level=data.get("level"),
                   consequence=bool(data.get("consequence", False)), fatal=bool(data.get("fatal", False)))


def failure_kind(value: Any) -> FailureKind:
    try:
        return FailureKind(value)
    except ValueError:
        return FailureKind.OTHER


class JobState(StrEnum):
    """Where a job stands, as `status` shows it and the store keeps it."""

    STARTING = "starting"  # registered by `start`; its runner has not launched yet
    WAITING = "waiting"  # for GPUs other processes hold
    RUNNING = "running"
    UNREACHABLE = "unreachable"  # its host cannot be reached: its attempt is re-adopted when it can
    BACKOFF = "backoff"  # an attempt ended; the next one launches after the backoff wait
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"
    CANCELLED = "cancelled"  # never launched: a job it runs `after` gave up (supervisor/jobs/dependencies.py)


class AttemptState(StrEnum):
    """Where one attempt (one launch of the job's command) stands."""

    LAUNCHING = "launching"  # stored before launch: a daemon killed here leaves it visible
    RUNNING = "running"
    ENDED = "ended"
    LOST = "lost"  # the daemon could not tell how it ended
    STOPPED = "stopped"  # by the user

    @property
    def active(self) -> bool:
        """Its process is (believed) alive: the daemon watches it, and re-adopts it after a restart."""
        return self in (AttemptState.LAUNCHING, AttemptState.RUNNING)


class Record(NamedTuple):
    """One record read from a log (immutable).

    ``offset`` is the byte offset where the record starts and ``end`` the offset just past
    its terminator, so following can resume at ``end``.  ``generation`` counts the times the
    log restarted from 0 under its follower (truncated, rotated): an offset is a place in the
    log only together with it.  ``redraw`` is true when the record
    was ended by a carriage return (a tqdm redraw) rather than a newline; ``cut`` is true
    when an over-long line was split to bound memory.

    A named tuple rather than a frozen dataclass: one is made for every line of every log
    followed, and a frozen dataclass costs several times as much to make (its ``__init__``
    goes through ``object.__setattr__`` for each field).
    """

    text: str
    offset: int
    end: int
    redraw: bool = False
    cut: bool = False
    generation: int = 0


@dataclass(slots=True)
class ProbeEvent:
    """What a probe derived from one record (or from several, for a traceback)."""

    kind: ProbeKind
    probe: str  # "<pack>.<probe id>"
    offset: int  # byte offset of the first record it was derived from
    line: str  # the record text with prefixes stripped (the final exception line for tracebacks)
    phase: Phase | None = None
    failure: Failure | None = None  # failure probes only
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Event:
    """An event as published on the bus and stored: tied to a job and attempt."""

    job: str
    attempt: int
    kind: EventKind
    message: str
    ts: float = field(default_factory=time.time)
    probe: str | None = None
    phase: Phase | None = None
    offset: int | None = None  # for probe events: where in the attempt's log it came from
    generation: int = 0  # ... in which generation of the log (see Record)
    data: dict[str, Any] = field(default_factory=dict)
    id: int | None = None  # assigned by the store
    failure: Failure | None = None  # failure events only
