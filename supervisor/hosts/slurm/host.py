"""The Slurm host: each attempt is one Slurm batch job.

``SlurmHost("slurm:[?log_root=PATH]")`` submits with `sbatch` from this machine (it must be
able to: Slurm's client commands on the PATH, `SLURM_CONF` or the usual config).  Where it
runs them (``SlurmCommands``) and where it reads the attempts' files (``files``) are
given to it: ``slurm+ssh://`` (slurm/ssh.py) runs them on a login node over SSH.  The batch
script runs the same wrapper as every host (base.WRAPPER_SH), so the attempt's tag and its
exit-status file exist on the node too; it waits for the command and exits with its code.
Slurm's `--output` is the attempt's log (appended to, never truncated), on a file system the
daemon shares with the nodes: it is followed like a local log.  The job's name is the
attempt's tag and its id is stored with the attempt: a restarted daemon re-adopts it by id
(by name, when the daemon died before the id was stored).

State and exit come from `scontrol`/`sacct` (slurm/jobs.py says how Slurm's states map
onto ours) and from the exit file.  Stop: `scancel --batch --signal=TERM` (the batch script
passes it on and lives on to record the exit), the grace period, then `scancel --signal=KILL --full` and a
plain `scancel`; Slurm's process tracking reaches the whole tree on the node.  GPU memory is
read on the node of a running job that holds GPUs, with `srun --jobid J --overlap nvidia-smi`.

The job is submitted with `--requeue`, so that Slurm may requeue it on preemption or node
failure (and an admin with `scontrol requeue`): the supervisor sees the requeue (Restarts),
ends the attempt as `preempted`, cancels the requeued copy and launches the next attempt
itself, with its own log.

Environment (the daemon's): SUPERVISE_SLURM_LOG_ROOT, the attempts' log root (default the
daemon's own log directory; it must be visible on the nodes at the same path);
SUPERVISE_SLURM_POLL_S, how often a running job's state is read (default 0.5).
"""

from __future__ import annotations

import asyncio
import os
import shlex
import time
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import structlog

from supervisor.core.config import default_paths
from supervisor.core.errors import HostError, LaunchError, SpecError, SuperviseError
from supervisor.gpu.nvml import GpuSample
from supervisor.hosts import _remote, _remote_parse
from supervisor.hosts.base import (
    ELSEWHERE,
    TAG_VAR,
    WRAPPER_SH,
    ExitStatus,
    Follower,
    KillReport,
    LaunchRequest,
    ProcessHandle,
    QueueState,
)
from supervisor.hosts.slurm.files import LocalFiles, SlurmFiles
from supervisor.hosts.slurm.jobs import JobInfo, SlurmCommands

log = structlog.get_logger("supervise.slurm")

ENV_LOG_ROOT = "SUPERVISE_SLURM_LOG_ROOT"
ENV_POLL_S = "SUPERVISE_SLURM_POLL_S"
ENV_NVIDIA_SMI = "SUPERVISE_SLURM_NVIDIA_SMI"
_SETTLE_S = 2.0  # after the exit file appears, how long Slurm may take to say how the job ended

# Run as the batch script, after `set -- LOG STATUS WORKDIR ARGV...`.  Its stdout is Slurm's
# --output (the log): the wrapper's pid line goes to /dev/null instead.  `scancel --batch
# --signal=TERM` reaches this shell, which passes TERM on to every process of the command's
# session but the wrapper (as the local host spares it), so the wrapper records the exit.
# Where it could not (it was killed with its command), the status `wait` saw is recorded here.
_BATCH_TAIL = r"""
pid=$!
term() {
  members=$(pgrep -s "$pid" 2>/dev/null) || { kill -TERM -- "-$pid" 2>/dev/null; return 0; }
  for p in $members; do [ "$p" = "$pid" ] || kill -TERM "$p" 2>/dev/null; done
}
trap term TERM
rc=0
while kill -0 "$pid" 2>/dev/null; do wait "$pid"; rc=$?; done
if [ -s "$status" ]; then rc=$(cat "$status"); else printf '%s\n' "$rc" >"$status"; fi
exit "$rc"
"""


def batch_script(request: LaunchRequest) -> str:
    args = " ".join(shlex.quote(a) for a in (request.log_path, request.status_path, request.workdir, *request.argv))
    return (f"#!/bin/sh\n# supervise attempt {request.tag}\nset -- {args}\nexec >/dev/null\n"
            f"{WRAPPER_SH}{_BATCH_TAIL}")


def _local_root(name: str) -> Path:
    """The log root of a ``slurm:`` host; SpecError for any other spelling."""
    parts = urlsplit(name)
    if parts.scheme != "slurm" or parts.netloc or parts.path:
        raise SpecError(f"host '{name}': a Slurm host is written 'slurm:' (optionally 'slurm:?log_root=PATH')")
    root = (parse_qs(parts.query).get("log_root") or [os.environ.get(ENV_LOG_ROOT, "")])[0]
    return Path(root).expanduser() if root else default_paths().logs / "slurm"


class SlurmHost:
    """Attempts as Slurm batch jobs submitted from this machine."""

    def __init__(self, name: str, *, commands: SlurmCommands | None = None, files: SlurmFiles | None = None) -> None:
        self.name = name
        self.capabilities = ELSEWHERE  # a shared filesystem is not assumed
        self.files: SlurmFiles = files if files is not None else LocalFiles(_local_root(name))
        self.poll_s = float(os.environ.get(ENV_POLL_S, "0.5"))
        self.nvidia_smi = os.environ.get(ENV_NVIDIA_SMI, "nvidia-smi")
        self.slurm = commands or SlurmCommands()
        self._seen: dict[str, JobInfo] = {}  # job id -> its latest state, for GPU sampling

    async def log_paths(self, job: str, attempt: int) -> tuple[str, str]:
        return await self.files.log_paths(job, attempt)

    async def launch(self, request: LaunchRequest) -> ProcessHandle:
        await self.files.prepare(request.log_path, request.status_path)
        args = [f"--job-name={request.tag}", f"--output={request.log_path}", "--open-mode=append",
                f"--chdir={request.workdir}", "--requeue", "--export=ALL", *request.scheduler_args]
        try:
            job_id = await self.slurm.submit(args, batch_script(request), {**request.env, TAG_VAR: request.tag})
        except HostError as exc:
            raise LaunchError(str(exc)) from exc
        log.info("submitted", job_id=job_id, tag=request.tag)
        return ProcessHandle(pid=0, start_time=None, pgid=0, tag=request.tag, log_path=request.log_path,
                             status_path=request.status_path, scheduler_id=job_id)

    async def _job_id(self, handle: ProcessHandle) -> str | None:
        if handle.scheduler_id:
            return handle.scheduler_id
        return await self.slurm.find(handle.tag)  # submitted, but the daemon died before storing its id

    async def _info(self, handle: ProcessHandle) -> JobInfo | None:
        job_id = await self._job_id(handle)
        if job_id is None:
            return None
        info = await self.slurm.info(job_id)
        if info.state == "RUNNING":
            self._seen[job_id] = info
        else:
            self._seen.pop(job_id, None)
        return info

    async def queue_state(self, handle: ProcessHandle) -> QueueState:
        info = await self._info(handle)
        if info is None or not info.queued:
            return QueueState(pending=False, detail=f"{info.nodes} (Slurm job {info.job_id})" if info else "")
        return QueueState(pending=True, reason=info.reason)

    async def wait_exit(self, handle: ProcessHandle) -> ExitStatus:
        settle_until: float | None = None
        while True:
            try:
                info = await self._info(handle)
            except HostError as exc:  # slurmctld away for a moment: the job goes on meanwhile
                log.warning("cannot read the job's state; trying again", tag=handle.tag, error=str(exc))
                await asyncio.sleep(max(self.poll_s, 2.0))
                continue
            if info is None or info.ended:
                return await self._exit_of(handle, info)
            if settle_until is None and await self.files.read(handle.status_path) is not None:
                # The command's exit is recorded; Slurm's final word (TIMEOUT, OUT_OF_MEMORY)
                # follows as the job completes: wait a little for it, not for the epilog.
                settle_until = time.monotonic() + _SETTLE_S
            elif settle_until is not None and time.monotonic() >= settle_until:
                return await self._exit_of(handle, info)
            await asyncio.sleep(self.poll_s)

    async def _exit_of(self, handle: ProcessHandle, info: JobInfo | None) -> ExitStatus:
        recorded = await self.exit_status(handle)
        end = info.scheduler_end if info is not None else None
        if recorded is not None:
            return ExitStatus(recorded.returncode, recorded.signal, scheduler_end=end)
        return info.exit_status() if info is not None else ExitStatus(returncode=None, signal=None)

    async def is_alive(self, handle: ProcessHandle) -> bool:
        info = await self._info(handle)
        return info is not None and not info.ended

    async def exit_status(self, handle: ProcessHandle) -> ExitStatus | None:
        text = (await self.files.read(handle.status_path) or "").strip()
        return ExitStatus.from_wrapper_code(int(text)) if text.lstrip("-").isdigit() else None

    async def attempt_pids(self, handle: ProcessHandle) -> set[int]:
        """Node-side pids are not ours to see: the job id stands for the job while it is active."""
        info = await self._info(handle)
        return {int(info.job_id)} if info is not None and info.active else set()

    async def kill_tree(self, handle: ProcessHandle, grace_s: float) -> KillReport:
        report = KillReport()
        info = await self._info(handle)
        if info is None or not info.active:
            return report
        who = [(int(info.job_id), f"Slurm job {info.job_id} ({info.state})")]
        if info.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "CONFIGURING") or info.restarts:
            await self.slurm.signal(info.job_id, None)  # nothing runs yet (or a requeued copy): cancel it
            report.terminated = who
            return report
        await self.slurm.signal(info.job_id, "TERM", batch_only=True)
        if await self._gone_within(handle, grace_s):
            report.terminated = who
            return report
        await self.slurm.signal(info.job_id, "KILL")
        await self.slurm.signal(info.job_id, None)
        report.killed = who
        if not await self._gone_within(handle, 30.0):
            report.survivors = who
        return report

    async def _gone_within(self, handle: ProcessHandle, seconds: float) -> bool:
        """Whether the job's processes end within ``seconds`` (its exit file, or Slurm says so)."""
        deadline = time.monotonic() + seconds
        while True:
            if await self.files.read(handle.status_path) is not None:
                return True  # the command's end is recorded: what is left is Slurm's cleanup
            info = await self._info(handle)
            if info is None or not info.active:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))

    def follow(self, path: str, offset: int, generation: int = 0) -> Follower:
        return self.files.follow(path, offset, generation, self.poll_s)

    async def sample_gpus(self) -> GpuSample:
        """nvidia-smi on the node of a running job of this daemon's that holds GPUs; never raises."""
        ts = time.time()
        job = next((i for i in reversed(self._seen.values()) if i.has_gpus), None)
        if job is None:
            return GpuSample(ts, False, "no running Slurm job of this daemon's holds GPUs", (), ())
        try:
            rc, out, err = await self.slurm.run(["srun", f"--jobid={job.job_id}", "--overlap", "--ntasks=1",
                                                 "--nodes=1", "/bin/sh", "-c", _remote.GPUS, "sh", self.nvidia_smi])
        except SuperviseError as exc:
            return GpuSample(ts, False, f"cannot sample GPUs of Slurm job {job.job_id}: {exc}", (), ())
        return _remote_parse.gpu_sample(ts, rc, out.splitlines(), err, job.nodes)

    async def close(self) -> None:
        self._seen.clear()
