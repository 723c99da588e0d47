"""A daemon stop ends every open stream at once: a follower gone quietly (Ctrl-C on `events -f`,
`logs -f`) or still reading (the page's live feed) never holds the daemon up."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys

import httpx
from conftest import REPO, DaemonProcess, wait_until
from e2e_jobs import supervise

from supervisor.core import protocol

QUIET_JOB = "import time\nprint('working', flush=True)\ntime.sleep(120)\n"


def _follower(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """A real CLI follower that has printed its first line (it is streaming)."""
    proc = subprocess.Popen([sys.executable, "-m", "supervisor.cli", *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None and proc.stdout.readline(), f"{args} printed nothing"
    return proc


def _interrupt(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    proc.communicate(timeout=20)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_daemon_stop_is_not_held_by_closed_or_open_streams(daemon: DaemonProcess, make_job, daemon_env) -> None:
    client = daemon.client()
    client.start(str(make_job("quiet", QUIET_JOB)), {})
    wait_until(lambda: any(e.kind == "launched" for e in client.events("quiet").events))
    # Followers of a job that prints nothing more: their streams stay quiet after the client goes.
    _interrupt(_follower(daemon_env, "events", "quiet", "-f"))
    _interrupt(_follower(daemon_env, "logs", "quiet", "-f"))
    # The page's live feed, still open and reading when the daemon stops.
    port = _free_port()
    url = client.web(protocol.WebRequest(port=port)).url
    token = url.rsplit("token=", 1)[1]
    with httpx.stream("GET", f"http://127.0.0.1:{port}/api/stream?job=quiet&after=0",
                      headers={"Authorization": f"Bearer {token}"}, timeout=30) as feed:
        assert feed.status_code == 200
        next(feed.iter_lines())
        stopped = supervise(daemon_env, "daemon", "stop", check=False)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr  # it waits 30 s, then says 69
    assert daemon.proc is not None
    daemon.proc.wait(timeout=10)
