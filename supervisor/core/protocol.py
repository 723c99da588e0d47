"""The control API's typed messages, imported by both the daemon and the CLI.

Transport: HTTP/1.1 over a Unix socket (mode 0600).  Every route takes and returns one of
these models as JSON; errors are `ErrorBody` with a non-2xx status.  Streams (`logs -f`,
`events -f`) are newline-delimited JSON of `LogChunk` / `EventInfo`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, Field, StrictBool

from supervisor.core.errors import ErrorKind
from supervisor.core.events import (
    AttemptState,
    BoundKind,
    EventKind,
    Failure,
    FailureKind,
    JobState,
    Phase,
    Verdict,
)
from supervisor.core.limits import MAX_GRACE_S
from supervisor.core.overrides import FieldOverrides
from supervisor.core.progress import BarProgress
from supervisor.core.usage import AttemptUsage

API_VERSION = 1

GraceSeconds = Annotated[float, Field(ge=0, le=MAX_GRACE_S, allow_inf_nan=False)]


class ErrorBody(BaseModel):
    error: str = Field(description="one line for humans: what went wrong and what to do")
    kind: ErrorKind = Field(description="the error's class, as errors.TABLE names it; the CLI raises that class")
    exit_code: int = Field(description="the CLI's exit status for this error (docs/reference/exit-codes.md)")


class StartRequest(BaseModel):
    spec_path: str = Field(description="absolute path of the job spec file")
    overrides: dict[str, str] = Field(default_factory=dict, description="--set KEY=VALUE pairs: [params] only")
    fields: FieldOverrides = Field(default_factory=FieldOverrides, description="--host, --python, --workdir, --shards")
    after: list[str] = Field(default_factory=list, description="--after JOB: jobs whose current run must be done first")


class StopRequest(BaseModel):
    grace_s: GraceSeconds | None = Field(default=None, description="seconds between SIGTERM and SIGKILL (0 to a day); default from spec")


class ProgressInfo(BaseModel):
    probe: str
    bar: str | None = None  # which of the probe's bars: its description, with the process drawing it
    done: float
    total: float | None = None
    rate_s_per_it: float | None = None
    eta_s: float | None = Field(default=None, description="seconds left, counted down from the bar's last step, while "
                                                          "its attempt is watched; null once that much time has gone "
                                                          "by without a step (see still_s), and for an ended attempt")
    still_s: float | None = Field(default=None, description="seconds since the bar last moved, while its attempt is "
                                                            "watched and the bar has an ETA to keep; null otherwise")

    @classmethod
    def of(cls, bar: BarProgress, *, ended: bool = False) -> ProgressInfo:
        """A stored attempt's bar, its ETA as of its last step; none once the attempt has ``ended``."""
        return cls(probe=bar.probe, bar=bar.bar, done=bar.done, total=bar.total, rate_s_per_it=bar.rate_s_per_it,
                   eta_s=None if ended else bar.eta_s)

    @classmethod
    def watched(cls, bar: BarProgress, still_s: float | None) -> ProgressInfo:
        """The bar of an attempt being watched, ``still_s`` after its last step: its ETA counted
        down from then.  An ETA that has run out is no ETA: the bar has stood still past it, and
        how long it has is what is said instead."""
        if bar.eta_s is None or still_s is None:
            return cls.of(bar)
        left = bar.eta_s - still_s
        return cls.of(bar).model_copy(update={"eta_s": left if left > 0 else None, "still_s": still_s})


class FailureInfo(BaseModel):
    kind: FailureKind
    line: str
    fingerprint: str | None = None
    traceback: str | None = None
    level: str | None = Field(default=None, description="the log level it was logged at, when the log said")

    @classmethod
    def of(cls, failure: Failure) -> FailureInfo:
        return cls(kind=failure.kind, line=failure.line, fingerprint=failure.fingerprint,
                   traceback=failure.traceback, level=failure.level)


class AttemptInfo(BaseModel):
    job: str
    n: int
    state: AttemptState
    host: str
    pid: int | None
    started: float
    ended: float | None
    exit_code: int | None
    exit_signal: int | None
    log_path: str
    phase: Phase | None
    progress: ProgressInfo | None
    verdict: Verdict | None
    reason: str | None
    failure: FailureInfo | None
    fingerprint: str | None
    action: str | None
    argv: list[str]
    run: int = Field(default=1, description="the run it belongs to: +1 at each `supervise start`; relaunches stay in their run")
    run_attempt: int = Field(default=1, description="its place in its run (1 for the run's first attempt), against max_attempts")
    shard: int | None = Field(default=None, description="a sharded job's shard index (-1: its gather step); null: unsharded")
    usage: AttemptUsage | None = Field(default=None, description="what it used (CPU, memory, GPUs), once it ended")
    checkpoint: str | None = Field(default=None, description="the checkpoint it started from (its {last_checkpoint}); "
                                   "null: none")
    params: dict[str, str] | None = Field(default=None, description="its [params] as `[restart.adjust]` changed them; "
                                          "null: the spec's own")


class GpuDeviceInfo(BaseModel):
    index: int
    name: str
    used_mib: int
    total_mib: int
    util_pct: int | None = None
    temperature_c: int | None = Field(default=None, description="the GPU die's temperature; None where NVML cannot tell")
    power_w: float | None = Field(default=None, description="power draw in watts; None where NVML cannot tell")
    processes: list[dict[str, Any]] = Field(default_factory=list)


class NextVerdict(BaseModel):
    verdict: Verdict
    in_s: float
    reason: str  # as it would read then
    bound_s: float | None = None  # the rule's whole bound, of which in_s is left
    # Where a stall bound came from: "history (12 intervals from 2 runs)", "this run", "default floor".
    bound_source: str | None = None

    @property
    def near(self) -> bool:
        """Worth showing: under a minute or a quarter of its bound left (a healthy job is always
        counting down to some rule; a countdown far off reads as an alarm it is not)."""
        return self.in_s < 60 or (self.bound_s is not None and self.in_s < 0.25 * self.bound_s)


class ShardStatus(BaseModel):
    shard: int = Field(description="the shard index; -1 for the gather step")
    state: JobState
    host: str
    attempts: int = Field(description="its attempts in the job's current run")
    attempt: AttemptInfo | None
    next_relaunch_in_s: float | None = None
    next_verdict: NextVerdict | None = Field(default=None, description="the shard's watchdog rule that comes due first")
    last_output_age_s: float | None = Field(default=None, description="seconds since the shard's running attempt wrote")


class ShardsStatus(BaseModel):
    """A sharded job at a glance: how many shards stand where, their summed progress, and the ETA
    of the slowest running shard (the job ends with it)."""

    total: int
    done: int
    running: int
    failed: int
    progress_done: float | None = None
    progress_total: float | None = None
    eta_s: float | None = None
    shards: list[ShardStatus]


class StallBoundInfo(BaseModel):
    bar: str
    bound_s: float
    in_s: float  # left of it if the bar does not move
    kind: BoundKind = Field(description="where the bound came from")
    source: str  # as read: "history (12 intervals from 2 runs)", "this run", "default floor", "first progress"
    history_intervals: int | None = None  # kind history: how many intervals, from how many runs
    history_runs: int | None = None


class JobStatus(BaseModel):
    name: str
    state: JobState
    reason: str
    host: str
    max_attempts: int
    attempt: AttemptInfo | None
    last_output_age_s: float | None = None
    next_relaunch_in_s: float | None = None
    next_verdict: NextVerdict | None = Field(default=None, description="the watchdog rule that comes due first if nothing changes")
    outputs: list[str] = Field(default_factory=list, description="where the job writes its output (the spec's `outputs`)")
    stall_bounds: list[StallBoundInfo] = Field(default_factory=list,
                                               description="each watched bar's stall bound and where it came from")
    shards: ShardsStatus | None = Field(default=None, description="a sharded job's shards (null: unsharded)")
    program_pid: int | None = Field(default=None, description="the running attempt's program (the child of its "
                                                              "wrapper shell, whose pid is attempt.pid)")
    status_line: str | None = Field(default=None, description="the running attempt's latest `STATUS=` sent to its "
                                                              "NOTIFY_SOCKET (sd_notify)")
    stacks: str | None = Field(default=None, description="the latest attempt's processes' innermost frames, dumped "
                                                         "before it was killed (`supervise stack JOB` for a running one)")
    spec_error: str | None = Field(default=None, description="why the job's stored spec no longer validates (a spec "
                                                             "stored by another version); null: it validates")


class PipelineStepStatus(BaseModel):
    step: str
    job: str  # PIPELINE.STEP
    state: JobState
    reason: str
    skipped: bool = Field(default=False, description="done already with the same inputs: not run again by the last start")
    attempt: AttemptInfo | None = None


class PipelineStatus(BaseModel):
    name: str
    state: JobState  # the first step that gave up, else the first not done, else done
    reason: str
    current: str | None = Field(default=None, description="the step that decides the pipeline's state")
    started: float
    eta_s: float | None = Field(default=None, description="seconds until the last step is done, from the steps' history")
    eta_note: str = Field(default="", description="why there is no ETA while steps are left, e.g. 'ETA unknown: no history for step X'")
    steps: list[PipelineStepStatus]


class PipelineStartRequest(BaseModel):
    spec_path: str = Field(description="absolute path of the pipeline file")
    overrides: dict[str, str] = Field(default_factory=dict, description="--set KEY=VALUE pairs (STEP.KEY for one step)")
    fields: FieldOverrides = Field(default_factory=FieldOverrides, description="--host, --python, --workdir: every step")


class PipelineStartResponse(BaseModel):
    pipeline: str
    started: list[str]  # step names, in order
    skipped: list[str]
    message: str


class QuarantineInfo(BaseModel):
    """A GPU or host jobs are kept away from (jobs/quarantine.py), until its expiry."""

    host: str
    gpu: int | None = Field(description="the GPU's index; null: the whole host")
    place: str = Field(description="HOST or HOST:GPU, as `supervise quarantine --clear` takes it")
    reason: str
    since: float
    until: float


class QuarantineResponse(BaseModel):
    """`supervise quarantine`: what is quarantined now; after a `--clear`, what that did."""

    quarantined: list[QuarantineInfo]
    message: str = ""


class QuarantineClearRequest(BaseModel):
    place: str = Field(max_length=1000, description="HOST or HOST:GPU (local, local:1, ssh://box)")


class StatusResponse(BaseModel):
    jobs: list[JobStatus]
    daemon_pid: int
    daemon_version: str
    gpu: list[GpuDeviceInfo] = Field(default_factory=list)
    gpu_note: str = ""
    pipelines: list[PipelineStatus] = Field(default_factory=list)
    web_note: str = Field(default="", description="why the web page asked for is not served ('' when it is, or is off)")
    quarantined: list[QuarantineInfo] = Field(default_factory=list, description="GPUs and hosts jobs are kept away from now")


class StartResponse(BaseModel):
    job: str
    attempt: int
    log_path: str
    message: str
    notes: list[str] = []  # what the user should know besides (a changed spec, a setting that never applies)
    # `cancelled`: never launched, a job it runs `after` gave up (the CLI exits 1); None: launched or waiting.
    held: JobState | None = Field(default=None, description="the job's state when its `after` holds it (waiting or cancelled)")


class KilledProcess(BaseModel):
    pid: int
    name: str
    signal: str
    reparented: bool = False  # its parent had died: found by tag, not by walking the tree


class StopResponse(BaseModel):
    job: str
    message: str
    processes: list[KilledProcess] = Field(default_factory=list)


class EventInfo(BaseModel):
    id: int
    job: str
    attempt: int
    ts: float
    kind: EventKind
    probe: str | None
    phase: Phase | None
    offset: int | None
    message: str
    data: dict[str, Any]
    failure: FailureInfo | None = None  # failure events only


class EventsResponse(BaseModel):
    events: list[EventInfo]


class AttemptsResponse(BaseModel):
    attempts: list[AttemptInfo]


class JobsResponse(BaseModel):
    jobs: list[JobStatus]


class JobNamesResponse(BaseModel):
    """The known jobs' names only: what shell completion asks for on every Tab (supervisor/shell_names.py)."""

    names: list[str]


class GpusResponse(BaseModel):
    available: bool
    note: str
    devices: list[GpuDeviceInfo]


class LogChunk(BaseModel):
    attempt: int
    offset: int
    text: str
    redraw: bool = False
    end: bool = False  # the attempt has ended and its log is fully sent
    # The log's current unterminated tail (a progress bar's latest redraw): shown until the
    # complete record, sent later with the same offset, replaces it.
    partial: bool = False
    ts: float | None = Field(default=None, description="with timestamps=1: when the record had arrived (Unix time, "
                                                         "to within a second); null where not known")


class PingResponse(BaseModel):
    pid: int
    version: str
    api_version: int = API_VERSION
    state_dir: str


class GpuSampleInfo(BaseModel):
    ts: float
    gpu: int
    used_mib: int
    total_mib: int


class JobGpuResponse(BaseModel):
    job: str
    host: str
    since: float
    until: float
    samples: list[GpuSampleInfo] = Field(default_factory=list, description="stored GPU samples of the job's host over its time span")


class SettingInfo(BaseModel):
    name: str
    value: Any
    source: str = Field(description="'default', the config file's path, or 'env SUPERVISE_X'")
    env: str = Field(description="the environment variable that sets it")
    description: str = ""


class ConfigResponse(BaseModel):
    config_file: str
    config_file_exists: bool
    settings: list[SettingInfo]
    changed_since_start: bool = Field(default=False, description="the running daemon's config file changed (or "
                                      "appeared, or went) since it read it: the settings shown are the ones it runs with")


class RestartRequest(BaseModel):
    grace_s: GraceSeconds | None = Field(default=None, description="seconds between SIGTERM and SIGKILL (0 to a day); default from spec")
    reload: StrictBool = Field(default=False, description="take the job's spec file as it is now (`restart --reload`); "
                                                          "false: the spec it was started with (a file changed since is said)")
    fields: FieldOverrides = Field(default_factory=FieldOverrides, description="--host, --python, --workdir, --shards: "
                                                                                "changed in the stored spec")


class RestartResponse(BaseModel):
    stopped: StopResponse | None = Field(default=None, description="the stop, when the job was running")
    started: StartResponse


class RemoveResponse(BaseModel):
    job: str
    message: str
    removed_logs: list[str] = Field(default_factory=list)


class PrunedLog(BaseModel):
    job: str
    attempt: int
    log_path: str
    bytes: int


class PruneResponse(BaseModel):
    message: str
    removed: list[PrunedLog] = Field(default_factory=list)


class ProcessStackInfo(BaseModel):
    pid: int
    name: str = Field(description="the process's command, shortened")
    stack: str | None = Field(description="py-spy's dump of its threads; null when there is none (see error)")
    error: str | None = Field(default=None, description="why none: not a Python process, ptrace refused, ...")


class StacksResponse(BaseModel):
    """`supervise stack`: the Python stacks of a running job's processes, now."""

    job: str
    attempt: int | None = Field(description="the attempt dumped; null when none is running")
    processes: list[ProcessStackInfo] = Field(default_factory=list)
    message: str = Field(description="one line: what was dumped, or why nothing was")


class HoldResponse(BaseModel):
    """`supervise hold` / `release`: whether kills of the job are held now, and what that did."""

    job: str
    held: bool
    message: str


class DaemonStopResponse(BaseModel):
    pid: int
    message: str


class WebRequest(BaseModel):
    """`supervise web`: serve the web page over TCP (or stop serving it, with ``off``)."""

    port: int = Field(default=8787, ge=1, le=65535)
    bind: str = Field(default="127.0.0.1", description="a loopback address unless allow_remote")
    allow_remote: bool = Field(default=False, description="allow a non-loopback bind (the token still guards it)")
    read_only: bool = Field(default=False, description="no actions (stop) from the page")
    off: bool = False


class WebResponse(BaseModel):
    url: str = Field(description="the page's address with its token; '' when off")
    message: str
