"""``nvidia-smi -q`` taken at a hang verdict, before the kill, and kept beside the attempt's log.

A collective that hangs may be a GPU's doing (a fallen-off device, a retired page, a clock stuck
low, a stuck NVLink): the full query at that moment says what the sampled memory figures do not,
and is gone once the ranks are killed.  Taken only where the daemon's GPU sampler sees GPUs; one
bounded run, off the event loop; its text saved whole (bounded), its path stored with the stacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path

from supervisor.core.tasks import cancel_and_wait

ENV_NVIDIA_SMI = "SUPERVISE_NVIDIA_SMI"  # the nvidia-smi to run (default: the PATH's)
TIMEOUT_S = 5.0  # within the stacks' own bound before a kill
MAX_BYTES = 4 * 1024 * 1024
# How long a killed nvidia-smi is waited for: one stuck in the driver may outlive SIGKILL a while.
REAP_S = 1.0


def find() -> str | None:
    named = os.environ.get(ENV_NVIDIA_SMI)
    if named is not None:
        return named if named and os.access(named, os.X_OK) else None
    return shutil.which("nvidia-smi")


async def take(to: Path, timeout_s: float = TIMEOUT_S) -> str:
    """Run ``nvidia-smi -q`` into ``to``; one line saying where it went, or why not."""
    smi = find()
    if smi is None:
        return "nvidia-smi -q: not found"
    try:
        proc = await asyncio.create_subprocess_exec(smi, "-q", stdin=asyncio.subprocess.DEVNULL,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    except OSError as exc:
        return f"nvidia-smi -q: could not run: {exc.strerror or exc}"
    waiting = asyncio.ensure_future(proc.communicate())
    try:
        out, _ = await asyncio.wait_for(asyncio.shield(waiting), timeout_s)
    except TimeoutError:
        proc.kill()
        await cancel_and_wait(waiting)
        # Waited for before returning: otherwise its transport, and the pipe it holds, stayed open
        # until the garbage collector came to them (a ResourceWarning then).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), REAP_S)
        return f"nvidia-smi -q: took more than {timeout_s:.0f} s (a GPU that does not answer)"
    text = out[:MAX_BYTES]
    try:
        await asyncio.to_thread(_write, to, text)
    except OSError as exc:
        return f"nvidia-smi -q: not saved: {exc.strerror or exc}"
    said = "" if proc.returncode == 0 else f" (it exited {proc.returncode})"
    return f"nvidia-smi -q saved to {to}{said}"


def _write(to: Path, text: bytes) -> None:
    to.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(to, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(text)
