"""The tables of a job spec: `[restart]`, `[health]`, `[alerts]`, `[gpu]`, `[limits]` and `[slurm]`, and the
bounded value types they use (durations are finite and at most a year)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from supervisor.core.errors import shown
from supervisor.core.events import Phase, Verdict
from supervisor.core.resource_limits import ResourceLimits, parse_cpu, parse_memory, parse_tasks
from supervisor.spec.adjust import AdjustRule

# Durations are finite and bounded: `stop_grace_s = inf` once made `stop` wait forever.  A year
# is far beyond any real phase deadline or backoff, and small enough for every clock computation.
MAX_SECONDS = 366 * 24 * 3600.0
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
PositiveSeconds = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]


def off_to_none(value: object) -> object:
    """TOML has no null: a rule that can be turned off is written `"off"` (or `false`)."""
    if value is False or (isinstance(value, str) and value.strip().lower() == "off"):
        return None
    return value


# A bound whose rule can be turned off: `"off"` (or `false`) in the spec, None in the model.
SecondsOrOff = Annotated[PositiveSeconds | None, BeforeValidator(off_to_none)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RestartSpec(_Strict):
    """When and how fast to relaunch (backoff waits are computed with tenacity)."""

    max_attempts: Annotated[int, Field(ge=1, le=1000)] = 3
    backoff_initial_s: Seconds = 10.0
    backoff_max_s: Seconds = 600.0
    backoff_multiplier: Annotated[float, Field(ge=1, le=100, allow_inf_nan=False)] = 2.0
    backoff_jitter_s: Seconds = 5.0
    on: list[Verdict] = Field(
        default_factory=lambda: [Verdict.CRASHED, Verdict.OOM, Verdict.KILLED, Verdict.STALLED, Verdict.SILENT,
                                 Verdict.HUNG]
    )
    stop_on_repeat: bool = True  # the same failure fingerprint twice in a row is a deterministic bug (an outside kill never)
    # `[restart.adjust] oom = { batch_size = "x0.5", min = "8" }`: [params] changed at each relaunch
    # after that verdict (spec/adjust.py); a relaunch with changed parameters is not "the same bug twice".
    adjust: dict[Verdict, AdjustRule] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _adjust_only_relaunched_verdicts(self) -> RestartSpec:
        # A rule for a verdict that is never relaunched would never apply: said, not ignored.
        for verdict in self.adjust:
            if verdict not in self.on and verdict is not Verdict.PREEMPTED:
                allowed = ", ".join(v.value for v in self.on) or "nothing"
                raise ValueError(f"adjust.{verdict.value}: {verdict.value} is not relaunched on "
                                 f"(restart.on: {allowed}); add it to restart.on or drop the rule")
        return self

    @model_validator(mode="after")
    def _cap_not_below_floor(self) -> RestartSpec:
        # A cap below the first wait was silently the first wait (10 s by default): a user who set
        # `backoff_max_s = 1` saw relaunches 10-15 s apart and no word why.
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(f"backoff_max_s ({self.backoff_max_s:g}s) is below backoff_initial_s "
                             f"({self.backoff_initial_s:g}s, the first wait): set backoff_initial_s too, "
                             "at or below the cap")
        return self


class HealthSpec(_Strict):
    """What counts as unhealthy.  Times are seconds."""

    stall_k: Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False)] = 3.0
    stall_floor_s: PositiveSeconds = 60.0
    stall_floor_by_phase: dict[Phase, PositiveSeconds] = Field(default_factory=dict)
    # Earlier attempts' pace only ever loosens the floor.  Set, it lets a bar's history tighten the
    # bound below the floor, never below this (and never below stall_k x this run's own pace).
    learned_min_s: PositiveSeconds | None = None
    # A step is reported `slow` (an alert, never a kill) only once it has lasted this long, however
    # fast its history: one 0.5 s step of a 0.15 s/step shard bar is a hiccup, not news to page anyone for.
    slow_floor_s: PositiveSeconds = 30.0
    # Before the first progress interval is known, a progress probe must advance within this.
    first_progress_s: dict[Phase, PositiveSeconds] = Field(default_factory=dict)
    silence_s: PositiveSeconds | None = None
    # Before any phase is recognised (a program no pack knows, or one that never gets going) no
    # output at all for this long is silent too.  Its own default, long because imports and
    # downloads may be quiet for minutes; `silence_s`, when set and shorter, applies instead.
    silence_before_phase_s: PositiveSeconds = 1800.0
    silence_phases: list[Phase] = Field(
        default_factory=lambda: [Phase.WEIGHT_LOADING, Phase.RUNNING]
    )
    phase_deadline_s: dict[Phase, PositiveSeconds] = Field(default_factory=dict)
    # systemd's WatchdogSec: set, the attempt is given WATCHDOG_USEC and must send `WATCHDOG=1` to
    # its NOTIFY_SOCKET at least this often (counted from its start), else it is `silent`.  Its
    # pings keep it from being judged silent in phases that print nothing.  Local attempts only.
    watchdog_s: PositiveSeconds | None = None
    # A failure logged, then nothing moved and nothing printed for this long, with the process
    # still alive: one rank died and the others hang in a collective (NCCL waits 10 minutes
    # by default before it gives up).  `"off"` turns the rule off.
    # Not applied once a server is ready: it logs a failed request and then idles, quietly.  Long
    # enough that a job writing a checkpoint after a background thread's traceback (a metrics
    # uploader's network error) is not cut short, half NCCL's default timeout.
    hang_after_failure_s: SecondsOrOff = 300.0
    # No output but "still waiting" lines (vLLM's "No available shared memory broadcast block
    # found in 60 seconds"), or none at all, for this long in a start-up phase: stalled.  Seen on
    # 2 H200s: a TP rank frozen while loading left the log silent for good once rank 0 had
    # loaded, and there is no bar left to stall.  A ready server may idle quietly, hence the phases.
    # `"off"` turns it off.
    waiting_s: SecondsOrOff = 1800.0
    waiting_phases: list[Phase] = Field(
        default_factory=lambda: [p for p in Phase if p.rank < Phase.ENGINE_READY.rank]
    )

    # A serving engine printing 0 tokens/s with requests running or waiting (vLLM's periodic
    # throughput lines, SGLang's decode batches) for this long is `hung`.  `"off"` turns it off.
    hung_s: SecondsOrOff = 600.0
    # A training loss that is NaN/inf, or over diverge_k x its median for diverge_steps readings
    # in a row, is `diverged`.  diverge_k `"off"`: only a non-finite loss counts.
    diverge_k: Annotated[Annotated[float, Field(gt=1, le=1e6, allow_inf_nan=False)] | None,
                         BeforeValidator(off_to_none)] = 10.0
    diverge_steps: Annotated[int, Field(ge=1, le=100_000)] = 20
    # One process's bar (a rank's, told apart by its lines' prefix) whose steps take over
    # straggler_factor x the median of its peers' rates for straggler_steps steps in a row is a
    # `straggler`: a warning naming it, never a kill.  `"off"` turns it off.
    straggler_factor: Annotated[Annotated[float, Field(gt=1, le=1e6, allow_inf_nan=False)] | None,
                                BeforeValidator(off_to_none)] = 2.0
    straggler_steps: Annotated[int, Field(ge=1, le=100_000)] = 5
    # The attempt's GPUs at 0% utilisation and no progress (no bar step, no new phase) for this
    # long is `idle`.  `"off"` turns it off.
    idle_s: SecondsOrOff = 1800.0
    # Each of hung_s, idle_s and diverge_k may be wrong about a job nobody here has seen: warned about,
    # not killed, unless the spec says otherwise (same values as `action`).
    hung_action: Literal["kill", "warn", "warn_then_kill"] = "warn"
    idle_action: Literal["kill", "warn", "warn_then_kill"] = "warn"
    diverge_action: Literal["kill", "warn", "warn_then_kill"] = "warn"

    # What an unhealthy verdict while it runs leads to: "kill" (at once), "warn" (an alert and the
    # verdict recorded, never a kill: the way to trust a new rule on a long run) or
    # "warn_then_kill" (an alert, then a kill after kill_after_s unless it moves meanwhile).
    action: Literal["kill", "warn", "warn_then_kill"] = "kill"
    kill_after_s: PositiveSeconds = 120.0

    def action_for(self, verdict: Verdict) -> str:
        """What an unhealthy ``verdict`` while it runs leads to (kill, warn, warn_then_kill)."""
        own = {Verdict.HUNG: self.hung_action, Verdict.DIVERGED: self.diverge_action, Verdict.IDLE: self.idle_action}
        return own.get(verdict, self.action)

    def stall_floor(self, phase: Phase | None) -> float:
        if phase is not None and phase in self.stall_floor_by_phase:
            return self.stall_floor_by_phase[phase]
        return self.stall_floor_s

    def stall_floor_setting(self, phase: Phase | None) -> str:
        """The spec's field that set ``stall_floor(phase)``; "" when it is the default.  Told by its
        value, not by what the file named: a stored spec is read back with every field filled in."""
        if phase is not None and phase in self.stall_floor_by_phase:
            return f"stall_floor_by_phase.{phase.value}"
        default = type(self).model_fields["stall_floor_s"].default
        return "" if self.stall_floor_s == default else "stall_floor_s"


class AlertSpec(_Strict):
    """Alerts beyond verdicts, giving up and done: phase milestones and progress ETAs."""

    notify_phases: list[Phase] = Field(default_factory=list)  # an alert when an attempt reaches each
    eta_every_s: PositiveSeconds | None = None  # an ETA alert at most this often while a bar moves
    eta_at_percent: list[Annotated[int, Field(ge=1, le=99)]] = Field(default_factory=list)  # ... and at these


class GpuSpec(_Strict):
    """Which GPUs the job uses and how to treat their memory around relaunches."""

    devices: list[Annotated[int, Field(ge=0)]] | Literal["all"] = "all"
    release_timeout_s: PositiveSeconds = 120.0
    release_tolerance_mib: Annotated[int, Field(ge=0)] = 512
    foreign_memory: Literal["wait", "refuse", "ignore"] = "wait"
    foreign_wait_s: Seconds = 300.0
    # A sharded job: each shard gets this many of `devices` (CUDA_VISIBLE_DEVICES), several shards a box.
    devices_per_shard: Annotated[int, Field(ge=1)] | None = None


class LimitsSpec(_Strict):
    """What one attempt may use, enforced by the kernel in the attempt's own cgroup v2 (local jobs), as
    systemd's MemoryMax=, CPUQuota= and TasksMax=; see the guide's "Resource limits"."""

    memory_max: str | int | None = None  # "8G", "512MiB" or bytes: past it the kernel's OOM killer ends a process
    cpu_max: str | None = None  # "200%": two cores' time at most (throttled, never killed)
    tasks_max: int | None = None  # processes and threads of the program and all it starts: a fork past it fails

    @field_validator("memory_max", mode="before")
    @classmethod
    def _valid_memory(cls, value: object) -> object:
        if value is not None:
            parse_memory(value)
        return value

    @field_validator("cpu_max", mode="before")
    @classmethod
    def _valid_cpu(cls, value: object) -> object:
        if value is not None:
            parse_cpu(value)
        return value

    @field_validator("tasks_max", mode="before")
    @classmethod
    def _valid_tasks(cls, value: object) -> object:
        if value is not None:
            parse_tasks(value)
        return value

    def resource_limits(self) -> ResourceLimits | None:
        """The limits in figures; None when the table sets none."""
        if self.memory_max is None and self.cpu_max is None and self.tasks_max is None:
            return None
        return ResourceLimits(
            memory_max_bytes=None if self.memory_max is None else parse_memory(self.memory_max),
            cpu_max_percent=None if self.cpu_max is None else parse_cpu(self.cpu_max),
            tasks_max=None if self.tasks_max is None else parse_tasks(self.tasks_max),
        )


# sbatch options the Slurm host sets itself: an `extra` item naming one would break following or
# re-adoption (the log path, the job's name = the attempt's tag, the script, the parsable id).
_SBATCH_OWN = ("-o", "--output", "-e", "--error", "-J", "--job-name", "--wrap", "--parsable", "-D", "--chdir",
               "--open-mode", "--requeue", "--no-requeue", "-a", "--array", "--export")
_SLURM_TIME_RE = re.compile(r"(\d+-)?\d+(:\d+){0,2}|\d+-\d+|UNLIMITED|INFINITE")


class SlurmSpec(_Strict):
    """sbatch options for a job on a Slurm host (`host = "slurm:"`); unset ones are Slurm's defaults."""

    partition: str = ""
    account: str = ""
    time: str = ""  # sbatch --time: minutes, [D-]HH:MM[:SS], ...
    nodes: Annotated[int, Field(ge=1, le=100_000)] = 1
    gpus: str = ""  # sbatch --gpus: "4" or "a100:4"
    gres: str = ""  # sbatch --gres: "gpu:4"
    extra: list[str] = Field(default_factory=list)  # more sbatch arguments, one argv item each

    @field_validator("time")
    @classmethod
    def _valid_time(cls, value: str) -> str:
        if value and not _SLURM_TIME_RE.fullmatch(value):
            raise ValueError(f"{shown(value)} is not a Slurm time: minutes, [D-]HH:MM[:SS] or UNLIMITED")
        return value

    @field_validator("partition", "account", "gpus", "gres")
    @classmethod
    def _one_word(cls, value: str) -> str:
        if any(c.isspace() or c == "\0" for c in value):
            raise ValueError(f"{shown(value)}: one word, without spaces")
        return value

    @field_validator("extra")
    @classmethod
    def _valid_extra(cls, value: list[str]) -> list[str]:
        for item in value:
            name = _no_nul(item).split("=", 1)[0]
            if name in _SBATCH_OWN:
                raise ValueError(f"{shown(item)}: the Slurm host sets {name} itself")
        return value

    def sbatch_args(self) -> tuple[str, ...]:
        named = {"--partition": self.partition, "--account": self.account, "--time": self.time,
                 "--gpus": self.gpus, "--gres": self.gres}
        args = [f"{flag}={value}" for flag, value in named.items() if value]
        return (*args, f"--nodes={self.nodes}", *self.extra)

def _no_nul(value: str) -> str:
    if "\0" in value:
        raise ValueError(f"{shown(value)} contains a NUL character, which no argument, path or variable can hold")
    return value
