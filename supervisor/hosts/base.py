"""The host interface: what the daemon needs from a machine that runs jobs.

`LocalHost` (local/host.py), `SshHost` (ssh/host.py) and `SlurmHost` (slurm/host.py) implement it;
the daemon never touches processes or files of a job except through it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import KW_ONLY, dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Protocol, runtime_checkable

from supervisor.core.events import Record
from supervisor.core.resource_limits import Controller, LimitHit, ResourceLimits
from supervisor.core.usage import AttemptUsage
from supervisor.gpu.nvml import GpuSample
from supervisor.hosts.stacks import StackDump

# The detached wrapper, identical locally and over SSH.  It starts the command in a new
# session (so it is its own process group and no terminal hang-up reaches it), with stdin
# from /dev/null and stdout+stderr appended to the attempt's log, ignores SIGHUP as nohup
# does, writes the exit status next to the log when the command ends (tmp + rename, so a
# reader never sees half a number), and prints the wrapper's pid.  `setsid` does not fork
# here: a background subshell of a non-interactive shell is not a group leader, so the
# printed pid is the session leader's and equals its process group id.  The log (and its
# directory) is created under umask 077, readable by its user only; the command keeps the
# umask the wrapper was given.  Given a cgroup (SUPERVISE_CGROUP, local attempts where
# cgroup v2 is writable), the subshell moves itself into it first ("0": the writing
# process), so the command and all it starts are born inside.  A cgroup it cannot enter leaves the
# command contained by tag and group, unless the cgroup holds the spec's limits (SUPERVISE_LIMITS):
# then the command never runs, and the attempt ends with status 113 and a line saying why.
# A status that cannot be written (a full disk) is tried again each second for up to an hour:
# the wrapper lives on meanwhile, so the daemon sees the attempt end once its true exit is known.
# A command the shell cannot find is said in one line of our own (NOT_FOUND_LINE, exit 127), the
# same from every shell; the inner shell is named "supervise" ($0), so that any message of its
# own starts with that, not with the exit-status path it was once given as $0.
# The inner shell's own stderr goes nowhere (the command's goes to the log, through fd 3): its
# "Terminated" or "Killed" once landed after a stop on the line of the bar the job was drawing.  The
# command sets its stderr itself before it execs (`sh -c "exec 2>&3 ..."`): a redirection on the
# command's line would still be in force when the shell reports how it ended (dash's way).  A
# death by SIGKILL is said instead in a line of our own (KILLED_LINE), on a line of its own, the
# same from every shell: it is what names an outside `kill -9` as such (probes/launch.toml).
WRAPPER_SH = r"""
log=$1; status=$2; workdir=$3; shift 3
( umask 077 && mkdir -p "$(dirname "$log")" && : >>"$log" ) || exit 111
cd "$workdir" 2>>"$log" || { echo "supervise: cannot enter working directory $workdir" >>"$log"; exit 112; }
( trap '' HUP
  if [ -n "${SUPERVISE_CGROUP:-}" ] && ! echo 0 >"$SUPERVISE_CGROUP/cgroup.procs"; then
    if [ -n "${SUPERVISE_LIMITS:-}" ]; then
      echo "supervise: cannot enter cgroup $SUPERVISE_CGROUP: not run without its [limits]" >&2
      echo 113 >"$status.tmp" && mv -f "$status.tmp" "$status"; exit 113; fi
    echo "supervise: cannot enter cgroup $SUPERVISE_CGROUP: contained by tag and group only" >&2; fi
  exec setsid sh -c 's=$1; shift; l=$1; shift; if command -v "$1" >/dev/null 2>&1; then
    sh -c "exec 2>&3 3>&-; exec \"\$@\"" supervise "$@"; rc=$?; else
    echo "supervise: command not found: $1" >&3; rc=127; fi
    if [ "$rc" -eq 137 ]; then [ -z "$(tail -c 1 "$l" 2>/dev/null)" ] || echo >&3
    echo "supervise: the command was killed by SIGKILL" >&3; fi; n=0
    until printf "%s\n" "$rc" > "$s.tmp" && mv -f "$s.tmp" "$s"; do
    n=$((n+1)); [ $n -gt 3600 ] && exit "$rc"; sleep 1; done' supervise "$status" "$log" "$@" 3>&2 2>/dev/null
) </dev/null >>"$log" 2>&1 &
echo $!
"""

TAG_VAR = "SUPERVISE_ATTEMPT"
_WRAPPER_SCRIPT_START = 's=$1; shift;'
NOT_FOUND_LINE = "supervise: command not found: "  # + the command, as the wrapper writes it to the log
KILLED_LINE = "supervise: the command was killed by SIGKILL"  # as the wrapper writes it to the log


def shown_command(cmdline: list[str]) -> str:
    """A process's command line as a user should read it: the wrapper's shell (``sh -c SCRIPT
    supervise STATUS ARGV...``) as the user's command it runs, marked as the wrapper, not its script."""
    if len(cmdline) > 6 and cmdline[1] == "-c" and cmdline[2].startswith(_WRAPPER_SCRIPT_START):
        return " ".join(cmdline[6:]) + "  (its wrapper)"  # sh -c SCRIPT supervise STATUS LOG ARGV...
    return " ".join(cmdline)


@dataclass(frozen=True)
class LaunchRequest:
    argv: list[str]
    workdir: str
    env: dict[str, str]
    log_path: str
    status_path: str
    tag: str  # the value of SUPERVISE_ATTEMPT on every descendant
    # Options for a batch scheduler host (sbatch's, as argv items); hosts that run the command
    # themselves ignore them.
    scheduler_args: tuple[str, ...] = ()
    # What the attempt may use, enforced in its own cgroup (local hosts; the spec refuses them elsewhere).
    limits: ResourceLimits | None = None


@dataclass(frozen=True)
class ProcessHandle:
    """Identifies a launched attempt across daemon restarts: pid *and* start time, against reuse."""

    pid: int
    start_time: float | None
    pgid: int
    tag: str
    log_path: str
    status_path: str
    scheduler_id: str | None = None  # a batch scheduler's id for the attempt (a Slurm job id)


class SchedulerEnd(StrEnum):
    """How a batch scheduler says an attempt ended, where that says more than its exit code."""

    PREEMPTED = "preempted"  # preempted, requeued, or its node failed: not the job's doing
    TIMEOUT = "timeout"  # its time limit ran out
    OUT_OF_MEMORY = "out_of_memory"  # the scheduler's memory limit killed it


@dataclass(frozen=True)
class ExitStatus:
    returncode: int | None  # None: the wrapper itself was killed before it could record one
    signal: int | None  # set when the command died of a signal (from 128+N)
    _: KW_ONLY  # what hosts may add, named: two optional facts of one type must never swap places
    kernel_oom: str | None = None  # the kernel's report of an OOM kill in the attempt, where the host reads one
    scheduler_end: SchedulerEnd | None = None  # what a batch scheduler says ended it, if it says
    limit_hit: LimitHit | None = None  # one of the attempt's own limits enforced by the kernel, where the host reads it
    # How long its `cpu_max` held the attempt back (cpu.stat throttled_usec), where it has one and the host reads it.
    cpu_throttled_s: float | None = None
    # When the command ended (wall time, this machine's clock): the wrapper wrote the status file
    # then, so its mtime says, even if no daemon watched; None where the host cannot tell.
    ended_at: float | None = None

    @classmethod
    def from_wrapper_code(cls, code: int | None, ended_at: float | None = None) -> ExitStatus:
        if code is not None and code > 128:
            return cls(returncode=code, signal=code - 128, ended_at=ended_at)
        return cls(returncode=code, signal=None, ended_at=ended_at)

    def describe(self) -> str:
        if self.scheduler_end is not None:
            return f"ended by the scheduler ({self.scheduler_end.value}); {replace(self, scheduler_end=None).describe()}"
        if self.returncode is None:
            return "ended without an exit status (the wrapper was killed)"
        if self.signal is not None:
            return f"killed by signal {self.signal}"
        return f"exited with code {self.returncode}"


@dataclass
class KillReport:
    terminated: list[tuple[int, str]] = field(default_factory=list)  # (pid, name) ended by TERM
    killed: list[tuple[int, str]] = field(default_factory=list)  # (pid, name) that needed KILL
    survivors: list[tuple[int, str]] = field(default_factory=list)  # still alive after KILL
    usage: AttemptUsage | None = None  # the attempt's cgroup figures, read before the cgroup went
    # Processes whose parent was not a process of the attempt when found (re-parented to
    # init after their parent died): found by group or tag, not by walking the tree.
    reparented: list[int] = field(default_factory=list)

    def summary(self) -> str:
        """Each process counted once: the counts add up to the processes found (the re-parented
        ones are among them, said apart)."""
        survivors = {p for p, _ in self.survivors}
        killed = {p for p, _ in self.killed} - survivors
        terminated = {p for p, _ in self.terminated} - killed - survivors
        total = len(terminated | killed | survivors)
        parts = [f"{len(terminated)} ended on SIGTERM", f"{len(killed)} needed SIGKILL"]
        if survivors:
            parts.append(f"{len(survivors)} STILL ALIVE: " + ", ".join(f"{p} {n}" for p, n in self.survivors))
        said = f"{total} process{'es' * (total != 1)}: " + ", ".join(parts)
        reparented = len(set(self.reparented) & (terminated | killed | survivors))
        return said + (f" ({reparented} of them re-parented, found by tag)" if reparented else "")


class Follower(Protocol):
    """Follows one log from a byte offset: batches of records as they are written."""

    @property
    def offset(self) -> int:
        """Byte offset just past the last record yielded: where a restarted follower resumes."""
        ...

    @property
    def generation(self) -> int:
        """How many times the log restarted from 0 (truncated, rotated), counted on from the
        generation it was resumed at: with ``offset``, where a restarted follower resumes."""
        ...

    @property
    def buffered(self) -> int:
        """Bytes read past ``offset`` and held back (an unterminated tail, a ``\r`` that may be half
        of a ``\r\n``): with ``offset``, how far the file had been read."""
        ...

    def partial_text(self, limit: int = 4096) -> str:
        """The unterminated tail after the last record ('' if none): a progress bar's latest
        redraw, which tqdm leaves unterminated until the next one.  For display and progress only."""
        ...

    def records(self) -> AsyncIterator[list[Record]]:
        """Batches of complete records, in log order (one iteration only)."""
        ...

    def finish(self) -> None:
        """The writer has exited: read to the end, yield the trailing partial line, then end."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class HostCapabilities:
    """What a host can do beyond the protocol, asked instead of comparing its name: the daemon
    runs on one machine, and some shortcuts hold only for attempts on that machine."""

    files_here: bool  # the attempt's log and status files are on the daemon's own filesystem
    kernel_log_here: bool  # the daemon's kernel log is the one that reports the attempt's OOM kills
    # The cgroup controllers each attempt gets (what a spec's [limits] can use), and why any is missing.
    cgroup_controllers: frozenset[Controller] = frozenset()
    cgroup_note: str = "no cgroup of ours on this host"


ON_THIS_MACHINE = HostCapabilities(files_here=True, kernel_log_here=True)
ELSEWHERE = HostCapabilities(files_here=False, kernel_log_here=False)


class Host(Protocol):
    name: str
    capabilities: HostCapabilities

    async def log_paths(self, job: str, attempt: int) -> tuple[str, str]:
        """A new attempt's log and exit-status paths on this host; never an existing file."""
        ...

    async def launch(self, request: LaunchRequest) -> ProcessHandle: ...

    async def wait_exit(self, handle: ProcessHandle) -> ExitStatus:
        """Return as soon as the attempt's wrapper ends (event-driven where the OS allows)."""
        ...

    async def is_alive(self, handle: ProcessHandle) -> bool: ...

    async def exit_status(self, handle: ProcessHandle) -> ExitStatus | None:
        """The recorded exit status, or None if the wrapper has not written one."""
        ...

    async def kill_tree(self, handle: ProcessHandle, grace_s: float) -> KillReport: ...

    async def attempt_pids(self, handle: ProcessHandle) -> set[int]:
        """Every live process of the attempt: its process group, its tree, and every tagged process."""
        ...

    def follow(self, path: str, offset: int, generation: int = 0) -> Follower: ...

    async def sample_gpus(self) -> GpuSample:
        """GPU memory per device and process now; never raises (``available=False`` and the
        reason when there is no driver, or the host cannot be reached)."""
        ...

    async def close(self) -> None: ...


@dataclass(frozen=True)
class QueueState:
    """Where a batch scheduler has an attempt: waiting in its queue (and why), or not."""

    pending: bool
    reason: str = ""  # the scheduler's word for why it waits: Resources, Priority, JobHeldUser, ...
    detail: str = ""  # where it runs, once it does (a node list)


@runtime_checkable
class QueuedHost(Protocol):
    """A host whose attempts may wait in a batch scheduler's queue before they run: while one
    waits it has no output to judge."""

    async def queue_state(self, handle: ProcessHandle) -> QueueState: ...


@runtime_checkable
class ProgramFinder(Protocol):
    """A host that can tell which process the attempt's wrapper runs (its program's pid)."""

    async def program_pid(self, handle: ProcessHandle) -> int | None:
        """The wrapper's child (None while it has none, or once it is gone)."""
        ...


@runtime_checkable
class UsageReader(Protocol):
    """A host that reads what an attempt used from its cgroup (the local host)."""

    async def attempt_usage(self, handle: ProcessHandle) -> AttemptUsage | None:
        """CPU seconds, peak memory and tasks: read as the attempt ended, or now while it runs."""
        ...


@dataclass(frozen=True)
class LogStat:
    """An attempt's log as it stands: its size, and when it last changed (wall time, this machine's
    clock, whatever the host's clock says)."""

    size: int
    modified_at: float


@runtime_checkable
class LogStatReader(Protocol):
    """A host that can say how far an attempt's log has been written, and when: what a re-adopted
    attempt must read (and how to date it) before it is judged."""

    async def log_stat(self, path: str) -> LogStat | None:
        """The log's size and last change; None when there is no such file."""
        ...


@dataclass(frozen=True)
class ListenAddress:
    """Where a host's connection is made, as its URL names it: what a start looks at first
    (`hosts/reach.py`), through the reach hook its kind registers (`hosts/registry.py`)."""

    host: str
    port: int
    display: str  # as a person writes it, in the one line that says nothing listens: user@host:port


@runtime_checkable
class Link(Protocol):
    """A host reached over a link that can go down (SSH): while it is down, nothing of its attempts
    can be read, so nothing of them may be judged."""

    def connected(self) -> bool:
        """Whether the link is up now."""
        ...


@dataclass(frozen=True)
class Forewarning:
    """What a signal sent before a kill did: which process got it, and whether it ended in the wait."""

    pid: int | None  # the program signalled; None when it had none left to signal
    waited_s: float
    ended: bool  # the program ended within the wait (its checkpoint, then its own exit)


@runtime_checkable
class Forewarner(Protocol):
    """A host that can send an attempt's program one signal of the job's choosing before the kill
    (a checkpoint request), and wait a while for it (the local host)."""

    async def forewarn(self, handle: ProcessHandle, signum: int, wait_s: float) -> Forewarning:
        """Signal the program, then wait up to ``wait_s`` for it to end; never kills."""
        ...


@runtime_checkable
class StackDumper(Protocol):
    """A host that can dump the Python stacks of an attempt's processes (py-spy) before a kill."""

    async def dump_stacks(self, handle: ProcessHandle, timeout_s: float) -> StackDump: ...


def log_paths(root: Path, job: str, attempt: int, suffix: int = 0) -> tuple[str, str]:
    """`<root>/<job>/attempt-<n>.log` and its exit-status file beside it (`attempt-<n>.<k>.log`
    when an older store's log already took the name: logs are never overwritten)."""
    base = root / job / (f"attempt-{attempt}" if not suffix else f"attempt-{attempt}.{suffix}")
    return f"{base}.log", f"{base}.exit"
