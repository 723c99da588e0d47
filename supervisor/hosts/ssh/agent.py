"""The resident remote shell: short scripts run one after another in one ``/bin/sh``.

See ``_Agent`` for why; ``_close_process`` ends any long-lived remote script.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets

from supervisor.hosts._asyncssh import asyncssh

_SHELL = "/bin/sh -s"


async def _close_process(proc: asyncssh.SSHClientProcess[bytes] | None) -> None:
    """End a long-lived remote program: closing its stdin ends it (the agent exits at its EOF)."""
    if proc is None:
        return
    with contextlib.suppress(Exception):
        proc.stdin.write_eof()
    with contextlib.suppress(Exception):
        proc.close()
    with contextlib.suppress(Exception):
        await asyncio.wait_for(proc.wait_closed(), timeout=2)



class _Agent:
    """A long-lived ``/bin/sh`` on the remote box that runs short scripts one after another.

    Every SSH exec starts the user's login shell, and with it their rc files (``conda
    init`` or ``pyenv init`` in a ``.bashrc`` cost 0.1-0.5 s of CPU a time): a resident
    shell pays that once per connection, and each script then costs one ``fork`` of it.
    Each script runs in a subshell with stdin from /dev/null (it can never read the
    command stream) and its stderr in a scratch file; a random end marker frames the
    answer.  Scripts in one lane run one at a time; slow ones get their own channel.
    The shell exits when its channel closes (EOF on stdin), removing its scratch file.
    """

    def __init__(self, lane: str) -> None:
        self.lane = lane
        self._lock = asyncio.Lock()
        self._proc: asyncssh.SSHClientProcess[bytes] | None = None
        self._conn: asyncssh.SSHClientConnection | None = None
        token = secrets.token_hex(8)
        self._end = f"@@supervise-end-{token}@@".encode()
        self._err_end = f"@@supervise-err-{token}@@".encode()

    async def run(self, conn: asyncssh.SSHClientConnection, script: bytes) -> tuple[int | None, bytes, bytes]:
        async with self._lock:
            if self._proc is None or self._conn is not conn:
                await self._start(conn)
            proc = self._proc
            assert proc is not None
            try:
                proc.stdin.write(b"(\n" + script + b") </dev/null 2>\"$_e\"\n_r=$?\n"
                                 b"printf '\\n%s %s\\n' '" + self._end + b"' \"$_r\"\n"
                                 b"cat \"$_e\"\nprintf '%s\\n' '" + self._err_end + b"'\n")
                out = await proc.stdout.readuntil(b"\n" + self._end + b" ")
                rc = (await proc.stdout.readline()).strip()
                err = await proc.stdout.readuntil(self._err_end + b"\n")
            except asyncio.IncompleteReadError as exc:
                await self._reset_locked()
                raise EOFError(f"the resident shell ({self.lane}) ended") from exc
            except BaseException:
                await self._reset_locked()  # cancelled or failed half-way: its state is unknown
                raise
        status = int(rc) if rc.lstrip(b"-").isdigit() else None
        return status, out[: -len(self._end) - 2], err[: -len(self._err_end) - 1]

    async def reset(self) -> None:
        async with self._lock:
            await self._reset_locked()

    async def _reset_locked(self) -> None:
        proc, self._proc, self._conn = self._proc, None, None
        await _close_process(proc)

    async def _start(self, conn: asyncssh.SSHClientConnection) -> None:
        await self._reset_locked()
        proc = await conn.create_process(_SHELL, encoding=None)
        proc.stdin.write(b"exec 2>/dev/null\n"
                         b"_e=$(mktemp 2>/dev/null) || _e=/tmp/supervise-agent.$$\n"
                         b"trap 'rm -f \"$_e\"' EXIT\n"
                         b"trap 'exit 1' HUP PIPE TERM\n")
        self._proc, self._conn = proc, conn

