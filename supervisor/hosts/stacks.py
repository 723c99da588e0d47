"""The Python stacks of an attempt's processes, dumped with py-spy before a kill (and on demand).

A job judged stalled, silent or hung is killed; without this, why it hung dies with it.
``dump`` runs ``py-spy dump --pid N`` for every process of the attempt at once (TP workers and
re-parented children included: the host names them), each bounded in time, none on the event
loop.  A process that is not Python (the wrapper's shell) is listed without a stack; py-spy
missing, or refused by ptrace, is said in one line and the kill goes on.

py-spy is found as ``SUPERVISE_PYSPY`` names it, else on the PATH, else beside the daemon's own
interpreter (a venv's ``bin``: ``pip install supervise`` brings it).

At most ``MAX_PROCESSES`` are dumped, and the dump says how many the attempt had.  A process's
command line (its name here, py-spy's "Process N: ..." header) is stored and shown with its
secret-looking flags masked and cut short: a launcher's children repeat its `--hf-token=...`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psutil

from supervisor.core.payloads import ProcessStackData, StacksData
from supervisor.core.redact import redact_command
from supervisor.core.tasks import cancel_and_wait

_WRAPPER_SCRIPT_START = 's=$1; shift;'  # the launch wrapper's inner shell (hosts/base.py's WRAPPER_SH)

ENV_PYSPY = "SUPERVISE_PYSPY"
PER_PROCESS_S = 10.0
REAP_S = 1.0  # how long a killed py-spy is waited for (one stuck on its target may outlive SIGKILL a while)
MAX_STACK_CHARS = 16_000  # per process: a deep stack of many threads stays readable, and bounded
MAX_PROCESSES = 64
_NOT_PYTHON = ("failed to find python version", "failed to find a python interpreter", "not a python")
# py-spy 0.4 says "Permission Denied: Try running again with elevated permissions ..."; older ones
# "Operation not permitted (os error 1)": compared in lower case.
_NO_PTRACE = ("permission denied", "operation not permitted", "ptrace", "elevated permissions")
NO_PTRACE_HINT = ("run the daemon as the job's user or as root, or allow ptrace "
                  "(`sysctl kernel.yama.ptrace_scope=0`, or CAP_SYS_PTRACE in a container)")
_SUSPEND_FAILED = "Failed to suspend process"
_REFUSED = "permission denied (ptrace)"  # a ProcessStack's error when the kernel refused py-spy


@dataclass(frozen=True)
class ProcessStack:
    pid: int
    name: str  # the process's command, shortened
    stack: str | None  # py-spy's dump; None when there is none (see ``error``)
    error: str | None = None  # why not: "not a Python process", "permission denied (ptrace)", ...


@dataclass(frozen=True)
class StackDump:
    processes: tuple[ProcessStack, ...]
    note: str = ""  # one line when no stack could be taken at all: py-spy missing, ptrace refused
    found: int = 0  # the attempt's processes, dumped or not (0: as many as were dumped)
    # Taken beside the stacks at a hang verdict (jobs/runner/_verdict.py): the flight recorder's
    # one line and its ranks' dump files (a torch distributed job), and where nvidia-smi -q went.
    flight_recorder: str = ""
    dumps: tuple[str, ...] = ()
    gpu_report: str = ""

    @property
    def python(self) -> tuple[ProcessStack, ...]:
        return tuple(p for p in self.processes if p.stack)

    @property
    def left_out(self) -> int:
        """Processes of the attempt not dumped (past ``MAX_PROCESSES``)."""
        return max(0, self.found - len(self.processes))

    def summary(self, frames: int = 3) -> str:
        """One line: the flight recorder's word first (which rank is behind), then each Python
        process's innermost frames (py-spy prints the innermost first)."""
        extra = "".join(f"{said}; " for said in (self.flight_recorder, self.gpu_report) if said)
        if not self.python:
            return extra + (self.note or "no Python process to dump")
        parts = [f"pid {p.pid} ({p.name[:40]}): " + " < ".join(first_frames(p.stack or "", frames)) for p in self.python]
        return extra + "; ".join(parts) + (f" ({self.counted()})" if self.left_out else "")

    def counted(self) -> str:
        """How many processes were dumped of how many, and why not all."""
        of = len(self.processes) + self.left_out
        cap = f" (at most {MAX_PROCESSES} are)" if self.left_out else ""
        return f"{len(self.processes)} of {of} processes dumped{cap}, {len(self.python)} with a Python stack"


def stacks_data(dump: StackDump) -> StacksData:
    """A dump as an event's payload: what `events`, the page and `stack` show."""
    return StacksData(dump.note, tuple(ProcessStackData(p.pid, p.name, p.stack, p.error) for p in dump.processes),
                      dump.left_out, dump.flight_recorder, dump.dumps, dump.gpu_report)


def first_frames(stack: str, n: int = 3) -> list[str]:
    """The first thread's innermost ``n`` frames of a py-spy dump (``func (file:line)`` lines)."""
    frames: list[str] = []
    in_thread = False  # the header (the command line, which may hold indented lines of its own) first
    for line in stack.splitlines():
        if line.startswith("Thread "):
            if frames:
                break
            in_thread = True
        elif in_thread and line.startswith("    ") and line.strip():
            frames.append(line.strip())
            if len(frames) == n:
                break
    return frames


def find_pyspy() -> str | None:
    named = os.environ.get(ENV_PYSPY)
    if named is not None:
        return named if named and os.access(named, os.X_OK) else None
    found = shutil.which("py-spy")
    if found:
        return found
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if os.access(beside, os.X_OK) else None


async def dump(pids: Iterable[int], timeout_s: float = PER_PROCESS_S) -> StackDump:
    """Every process's stack, all at once, each within ``timeout_s``."""
    everyone = sorted(set(pids))
    wanted = everyone[:MAX_PROCESSES]
    if not wanted:
        return StackDump((), "no process of the attempt is alive")
    pyspy = find_pyspy()
    if pyspy is None:
        return StackDump(tuple(ProcessStack(pid, _name(pid), None, "py-spy not found") for pid in wanted),
                         "no stacks: py-spy not found (`pip install py-spy` beside supervise, or set SUPERVISE_PYSPY)",
                         len(everyone))
    found = await asyncio.gather(*(_one(pyspy, pid, timeout_s) for pid in wanted))
    note = ""
    refused = [p.pid for p in found if p.error and p.error.startswith(_REFUSED)]
    if refused and not any(p.stack for p in found):
        note = (f"no stacks: py-spy could not attach to pid {', '.join(map(str, refused[:8]))}: "
                f"permission denied (ptrace); {NO_PTRACE_HINT}")
    return StackDump(tuple(found), note, len(everyone))


async def _one(pyspy: str, pid: int, timeout_s: float) -> ProcessStack:
    name = _name(pid)
    found = await _run(pyspy, pid, name, timeout_s, [])
    if found.error is not None and _SUSPEND_FAILED in found.error:
        # A process that is stopped already (SIGSTOP, a frozen rank, Ctrl-Z) cannot be paused again:
        # its memory is read as it stands, which is consistent since nothing runs.
        found = await _run(pyspy, pid, name, timeout_s, ["--nonblocking"])
    return found


async def _run(pyspy: str, pid: int, name: str, timeout_s: float, flags: list[str]) -> ProcessStack:
    try:
        proc = await asyncio.create_subprocess_exec(pyspy, "dump", *flags, "--pid", str(pid),
                                                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        return ProcessStack(pid, name, None, f"py-spy could not run: {exc.strerror or exc}")
    waiting = asyncio.ensure_future(proc.communicate())
    try:
        out, err = await asyncio.wait_for(asyncio.shield(waiting), timeout_s)
    except TimeoutError:
        proc.kill()
        await cancel_and_wait(waiting)
        # Waited for before returning: otherwise its transport, and the pipe it holds, stayed open
        # until the garbage collector came to them (a ResourceWarning then).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), REAP_S)
        return ProcessStack(pid, name, None, f"py-spy took more than {timeout_s:.0f}s")
    return parse_one(pid, name, proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


def parse_one(pid: int, name: str, returncode: int | None, out: str, err: str) -> ProcessStack:
    """One ``py-spy dump`` run as a ``ProcessStack`` (also what the SSH host's box printed)."""
    name = redact_command(name, 120)
    if returncode == 0 and out.strip():
        text = out if len(out) <= MAX_STACK_CHARS else out[:MAX_STACK_CHARS] + "\n… (cut)"
        return ProcessStack(pid, name, _header_redacted(text))
    said = " ".join((err or out).split())
    said = said[max(0, said.find("Error:")):][:300]  # py-spy prints the process header first
    lower = said.lower()
    if any(s in lower for s in _NOT_PYTHON):
        return ProcessStack(pid, name, None, "not a Python process")
    if any(s in lower for s in _NO_PTRACE):
        return ProcessStack(pid, name, None, f"{_REFUSED}: {said}")
    if "No such process" in said:
        return ProcessStack(pid, name, None, "ended meanwhile")
    return ProcessStack(pid, name, None, said or f"py-spy exited {returncode}")


def _header_redacted(stack: str) -> str:
    """py-spy's dump begins "Process N: <its command line>": that line as ``redact_command`` has it."""
    first, newline, rest = stack.partition("\n")
    if not first.startswith("Process "):
        return stack
    return redact_command(first) + newline + rest


def parse_remote(out: str, note_where: str, found_count: int = 0) -> StackDump:
    """What the SSH host's ``_remote.STACKS`` printed: "=== PID RC NAME" headers, each followed by
    its py-spy output.  ``found_count``: the attempt's processes (the box was asked for the first
    ``MAX_PROCESSES``)."""
    if out.strip() == "nopyspy":
        return StackDump((), f"no stacks: py-spy not found on {note_where} (`pip install --user py-spy` there)")
    found: list[ProcessStack] = []
    head: tuple[int, int, str] | None = None
    body: list[str] = []

    def close() -> None:
        if head is not None:
            text = "\n".join(body).strip("\n")
            found.append(parse_one(head[0], head[2], head[1], text if head[1] == 0 else "", text))

    for line in out.splitlines():
        if line.startswith("=== "):
            close()
            pid, rc, *name = line[4:].split(" ", 2)
            head = (int(pid), int(rc) if rc.lstrip("-").isdigit() else 1, name[0] if name else "?") if pid.isdigit() else None
            body = []
        else:
            body.append(line)
    close()
    note = ""
    refused = [p.pid for p in found if p.error and p.error.startswith(_REFUSED)]
    if refused and not any(p.stack for p in found):
        note = (f"no stacks: py-spy could not attach to pid {', '.join(map(str, refused[:8]))} on {note_where}: "
                "permission denied (ptrace); run the job as the login's user")
    return StackDump(tuple(found[:MAX_PROCESSES]), note, max(found_count, len(found)))


def _name(pid: int) -> str:
    try:
        cmd = psutil.Process(pid).cmdline()
    except psutil.Error:
        return "?"
    if len(cmd) > 5 and cmd[1] == "-c" and cmd[2].startswith(_WRAPPER_SCRIPT_START):
        return "the launch wrapper (sh)"
    # One line: a `python -c` program's code has newlines of its own.
    return redact_command(" ".join(" ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(cmd[:4])).split()), 120)
