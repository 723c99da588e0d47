"""Slurm's commands as the Slurm host uses them, and what their answers mean.

``SlurmCommands`` runs `sbatch`, `scontrol`, `sacct`, `scancel` and `srun` on the machine
that can (this one) and reads their answers into ``JobInfo``: the job's state, why it waits,
how often it was requeued, its exit code, its nodes.  A job's state is read from
`scontrol show job` while the controller still knows it (MinJobAge after its end), then
from `sacct` where accounting is on.

How Slurm's states map onto the supervisor's (``JobInfo.scheduler_end``):
    PENDING, CONFIGURING, REQUEUE_*        queued: never judged stalled or silent
    RUNNING, COMPLETING, SUSPENDED, ...    running: watched
    COMPLETED, FAILED, CANCELLED           ended: the exit code (the exit file) decides
    PREEMPTED, NODE_FAIL, BOOT_FAIL, or a requeue (Restarts > 0)   preempted
    TIMEOUT, DEADLINE                      timeout
    OUT_OF_MEMORY                          out of memory
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

from supervisor.core.errors import HostError
from supervisor.hosts.base import ExitStatus, SchedulerEnd

_QUEUED = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
_RUNNING = frozenset({"RUNNING", "COMPLETING", "SUSPENDED", "STOPPED", "SIGNALING", "STAGE_OUT", "RESIZING"})
_ENDS = {
    "PREEMPTED": SchedulerEnd.PREEMPTED, "NODE_FAIL": SchedulerEnd.PREEMPTED, "BOOT_FAIL": SchedulerEnd.PREEMPTED,
    "TIMEOUT": SchedulerEnd.TIMEOUT, "DEADLINE": SchedulerEnd.TIMEOUT,
    "OUT_OF_MEMORY": SchedulerEnd.OUT_OF_MEMORY,
}
GONE = "GONE"  # neither scontrol nor sacct knows the job (purged, no accounting)
_COMMAND_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str  # Slurm's JobState word (PENDING, RUNNING, COMPLETED, ...), or GONE
    reason: str = ""  # why it waits (Resources, Priority, JobHeldUser, ...); "" for none
    restarts: int = 0  # how often Slurm requeued it
    exit_code: int | None = None  # the batch script's, from Slurm's ExitCode=code:signal
    exit_signal: int | None = None
    nodes: str = ""
    tres: str = ""  # what it was allocated: cpu=1,mem=...,gres/gpu=4

    @property
    def queued(self) -> bool:
        return self.state in _QUEUED and not self.restarts

    @property
    def active(self) -> bool:
        """Its processes may still run (or will): queued, running, or being cleaned up."""
        return self.state in _QUEUED or self.state in _RUNNING

    @property
    def ended(self) -> bool:
        """Over as far as the supervisor is concerned: ended, gone, or requeued (a new attempt's turn)."""
        return not self.active or self.restarts > 0

    @property
    def scheduler_end(self) -> SchedulerEnd | None:
        if self.restarts > 0:
            return SchedulerEnd.PREEMPTED
        return _ENDS.get(self.state)

    @property
    def has_gpus(self) -> bool:
        return "gpu" in self.tres

    def exit_status(self) -> ExitStatus:
        """What Slurm says of the exit, where the wrapper could not record it (killed with its job)."""
        if self.exit_signal:
            return ExitStatus(returncode=128 + self.exit_signal, signal=self.exit_signal, scheduler_end=self.scheduler_end)
        return ExitStatus(returncode=self.exit_code if self.state != GONE else None, signal=None,
                          scheduler_end=self.scheduler_end)


def parse_scontrol(job_id: str, text: str) -> JobInfo | None:
    """One job's `scontrol -o show job` line; None if it does not describe the job."""
    fields = dict(re.findall(r"(?:^|\s)([A-Za-z/:]+)=(\S*)", text))
    state = fields.get("JobState")
    if not state:
        return None
    code, _, sig = fields.get("ExitCode", "").partition(":")
    reason = fields.get("Reason", "")
    return JobInfo(job_id=job_id, state=state, reason="" if reason in ("None", "(null)") else reason,
                   restarts=_int(fields.get("Restarts")) or 0, exit_code=_int(code), exit_signal=_int(sig) or None,
                   nodes="" if fields.get("NodeList") == "(null)" else fields.get("NodeList", ""),
                   tres=fields.get("TRES") or fields.get("AllocTRES", ""))


def parse_sacct(job_id: str, text: str) -> JobInfo | None:
    """`sacct -n -P -X -o State,ExitCode,NodeList,AllocTRES` for one job."""
    for line in text.splitlines():
        parts = line.split("|")
        if len(parts) < 4 or not parts[0]:
            continue
        code, _, sig = parts[1].partition(":")
        return JobInfo(job_id=job_id, state=parts[0].split()[0], exit_code=_int(code), exit_signal=_int(sig) or None,
                       nodes=parts[2], tres=parts[3])
    return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:
        return None


class SlurmCommands:
    """Slurm's client commands on this machine (`slurm:`): each one process, never a shell.
    ``run`` is the one way they are run: slurm/ssh.py's subclass runs them on a login node."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self._env = dict(env) if env is not None else None

    async def run(self, argv: list[str], *, stdin: bytes | None = None,
                  env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
        """``argv`` with ``env`` added to the environment; (exit status, stdout, stderr)."""
        base = self._env if self._env is not None else os.environ
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={**base, **env} if env else self._env)
        except OSError as exc:
            raise HostError(f"cannot run {argv[0]} ({exc.strerror or exc}): is Slurm's client installed and on "
                            "the daemon's PATH?") from exc
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin), timeout=_COMMAND_TIMEOUT_S)
        except TimeoutError as exc:
            proc.kill()
            await proc.wait()
            raise HostError(f"{argv[0]} did not answer within {_COMMAND_TIMEOUT_S:.0f}s: is slurmctld up?") from exc
        return proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")

    async def submit(self, args: list[str], script: str, env: Mapping[str, str]) -> str:
        """sbatch; the new job's id."""
        rc, out, err = await self.run(["sbatch", "--parsable", *args], stdin=script.encode(), env=env)
        job_id = out.strip().split(";")[0]
        if rc != 0 or not job_id.isdigit():
            raise HostError(f"sbatch refused the job: {(err.strip() or out.strip() or f'exit {rc}')[:400]}")
        return job_id

    async def info(self, job_id: str) -> JobInfo:
        rc, out, err = await self.run(["scontrol", "-o", "show", "job", job_id])
        found = parse_scontrol(job_id, out) if rc == 0 else None
        if found is not None:
            return found
        if rc != 0 and "Invalid job id" not in err:
            raise HostError(f"scontrol cannot say how Slurm job {job_id} is: {err.strip()[:300]}")
        # The controller forgot it (MinJobAge): accounting may remember.
        rc, out, _ = await self.run(["sacct", "-n", "-P", "-X", "-j", job_id, "-o", "State,ExitCode,NodeList,AllocTRES"])
        return (parse_sacct(job_id, out) if rc == 0 else None) or JobInfo(job_id=job_id, state=GONE)

    async def find(self, name: str) -> str | None:
        """The id of the job named ``name`` (an attempt's tag) Slurm still has queued or running."""
        rc, out, _ = await self.run(["squeue", "-h", "-n", name, "-o", "%i"])
        ids = out.split() if rc == 0 else []
        return ids[-1] if ids else None

    async def signal(self, job_id: str, signal_name: str | None, *, batch_only: bool = False) -> None:
        """scancel: ``signal_name`` to every process of the job (--full), or to its batch script
        alone; None cancels the job (it ends, queued or not)."""
        scope = "--batch" if batch_only else "--full"
        args = ["scancel", job_id] if signal_name is None else ["scancel", f"--signal={signal_name}", scope, job_id]
        rc, _, err = await self.run(args)
        if rc != 0 and "already completing or completed" not in err and "Invalid job id" not in err:
            raise HostError(f"scancel of Slurm job {job_id} failed: {err.strip()[:300]}")
