"""A job's own heartbeat through its NOTIFY_SOCKET (systemd's sd_notify protocol), with real
programs sending plain datagrams to a real daemon: its status line shown, its pings keeping a
silent phase alive, a stopped heartbeat judged and killed, a flooding sender bounded."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import supervise

from supervisor.cli.client import Client
from supervisor.cli.views import status_block

# The protocol as systemd's sd_notify(3) and Python's `sdnotify` package speak it: a datagram of
# KEY=VALUE lines to $NOTIFY_SOCKET, an address starting with "@" being an abstract one.
SD_NOTIFY = """
import os, socket, sys, time

def notifier():
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return None  # not run under a notify socket: sd_notify does nothing
    if address.startswith("@"):
        address = "\\0" + address[1:]
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.connect(address)  # as sdnotify.SystemdNotifier does
    return sock

SOCK = notifier()

def notify(state, flags=0):
    if SOCK is not None:
        try:
            SOCK.send(state.encode(), flags)
        except BlockingIOError:
            pass  # a full queue: the datagram is dropped (sent with MSG_DONTWAIT)
"""


def finished(client: Client, job: str) -> bool:
    return client.status(job).jobs[0].state in ("done", "failed", "stopped")


def test_pings_keep_a_silent_phase_alive_and_status_is_shown(daemon: DaemonProcess, home: Path,
                                                              make_job: Callable[..., Path]) -> None:
    seen = home / "env.json"
    spec = make_job("beat", SD_NOTIFY + f"""
json_env = {{k: os.environ.get(k) for k in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID")}}
open({str(seen)!r}, "w").write(__import__("json").dumps(json_env))
notify("READY=1")
notify("STATUS=loading shard 3/8")
# A phase that prints nothing for 5 s, three times the silence bound: alive only by its pings.
end = time.monotonic() + 5
while time.monotonic() < end:
    notify("WATCHDOG=1")
    time.sleep(0.2)
print("finished", flush=True)
""", extra="[health]\nsilence_s = 1.5\nwatchdog_s = 1.0\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    job = wait_until(lambda: next((j for j in client.status("beat").jobs if j.status_line), None), timeout=20)
    assert job.status_line == "loading shard 3/8"  # type: ignore[union-attr]
    assert "  status loading shard 3/8" in status_block(job).splitlines()  # type: ignore[arg-type]
    wait_until(lambda: finished(client, "beat"), timeout=30)
    attempt = client.attempts("beat").attempts[0]
    assert attempt.verdict == "done", attempt.reason
    env = json.loads(seen.read_text())
    assert env["NOTIFY_SOCKET"].startswith(str(home / "notify"))
    assert env["WATCHDOG_USEC"] == "1000000"
    assert env["WATCHDOG_PID"] is None  # any process of the attempt may ping (torchrun's workers too)
    said = [e for e in client.events("beat").events if e.probe == "sd_notify"]
    # READY once, the status line, and the first ping only (what a new daemon reads to know it pings).
    assert [e.data["sd_notify"] for e in said] == ["READY", "STATUS", "WATCHDOG"]
    assert said[1].data["status"] == "loading shard 3/8"
    assert not Path(env["NOTIFY_SOCKET"]).exists()  # removed with the attempt's watch


def test_a_stopped_heartbeat_is_judged_silent_and_killed(daemon: DaemonProcess, home: Path,
                                                        make_job: Callable[..., Path]) -> None:
    # It goes on printing: only its heartbeat stops (a main loop stuck while a logging thread runs).
    spec = make_job("stuck", SD_NOTIFY + """
import threading
def chatter():
    while True:
        print("still here", flush=True)
        time.sleep(0.1)
threading.Thread(target=chatter, daemon=True).start()
for _ in range(5):
    notify("WATCHDOG=1")
    time.sleep(0.2)
time.sleep(600)
""", extra="[health]\nwatchdog_s = 1.0\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    started = time.monotonic()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "stuck"), timeout=30)
    assert time.monotonic() - started < 15
    attempt = client.attempts("stuck").attempts[0]
    assert attempt.verdict == "silent", attempt.reason
    assert "no WATCHDOG=1 heartbeat for" in (attempt.reason or "") and "since its last" in (attempt.reason or "")
    assert attempt.exit_signal is not None  # killed, not ended on its own
    events = client.events("stuck").events
    assert any(e.kind == "action" and "killed the process tree" in e.message for e in events)


def test_a_job_that_never_pings_is_judged_from_its_start(daemon: DaemonProcess, home: Path,
                                                        make_job: Callable[..., Path]) -> None:
    spec = make_job("mute", """
import time
while True:
    print("working", flush=True)
    time.sleep(0.1)
""", extra="[health]\nwatchdog_s = 1.0\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: finished(client, "mute"), timeout=30)
    attempt = client.attempts("mute").attempts[0]
    assert attempt.verdict == "silent"
    assert "none since its start" in (attempt.reason or "")


def test_a_flooding_sender_neither_stalls_the_daemon_nor_fills_the_store(daemon: DaemonProcess, home: Path,
                                                                        make_job: Callable[..., Path]) -> None:
    spec = make_job("flood", SD_NOTIFY + """
SOCK is not None and SOCK.setblocking(False)
n = 0
end = time.monotonic() + 4
while time.monotonic() < end:
    n += 1
    notify(f"WATCHDOG=1\\nSTATUS=step {n}", socket.MSG_DONTWAIT)
print("sent", n, flush=True)
SOCK is not None and SOCK.setblocking(True)
notify("WATCHDOG=1\\nSTATUS=last")  # waits for room in the queue the daemon reads at its own pace
time.sleep(1)
""", extra="[health]\nwatchdog_s = 2.0\n[restart]\nmax_attempts = 1\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: client.status("flood").jobs[0].status_line, timeout=20)
    slowest = 0.0
    while not finished(client, "flood"):
        before = time.monotonic()
        client.ping()
        slowest = max(slowest, time.monotonic() - before)
        time.sleep(0.05)
    assert slowest < 1.0, f"a ping took {slowest:.2f}s during the flood"
    attempt = client.attempts("flood").attempts[0]
    assert attempt.verdict == "done", attempt.reason
    log = Path(attempt.log_path).read_text()
    sent = int(log.split("sent", 1)[1].split()[0])
    assert sent > 10_000  # a flood indeed
    said = [e for e in client.events("flood").events if e.probe == "sd_notify"]
    assert [e.data["sd_notify"] for e in said].count("WATCHDOG") == 1  # the first ping; none after
    statuses = [e for e in said if e.data["sd_notify"] == "STATUS"]
    # One stored per 10 s window (and the last at the end), whatever was sent.
    assert 1 <= len(statuses) <= 3, [e.message for e in statuses]
    assert statuses[-1].data["status"] == "last"
    assert daemon.proc is not None and daemon.proc.poll() is None


@pytest.mark.parametrize("value", ["0", "-1", '"soon"', "nan", "1e300", "[1]"])
def test_a_bad_watchdog_s_is_one_line_exit_65_and_nothing_stored(daemon: DaemonProcess, home: Path,
                                                                  daemon_env: dict[str, str], value: str) -> None:
    spec = home / "wd.toml"
    spec.write_text(f'name = "wd"\ncommand = ["true"]\n[health]\nwatchdog_s = {value}\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1, result.stderr
    assert "health.watchdog_s" in result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and daemon.proc is not None and client.ping().pid == daemon.proc.pid


def test_watchdog_s_on_a_remote_host_is_refused(daemon: DaemonProcess, home: Path,
                                                daemon_env: dict[str, str]) -> None:
    spec = home / "remote.toml"
    spec.write_text('name = "remote"\ncommand = ["true"]\nhost = "ssh://nobody@127.0.0.1:1"\npython = "/usr/bin/python3"\n'
                    'workdir = "/tmp"\n[health]\nwatchdog_s = 5\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1, result.stderr
    assert "watchdog_s" in result.stderr and "local" in result.stderr
    client = daemon.client()
    assert client.status().jobs == [] and daemon.proc is not None and client.ping().pid == daemon.proc.pid


def test_a_new_daemon_binds_the_socket_again_and_hears_the_heartbeat(daemon: DaemonProcess, home: Path,
                                                                    make_job: Callable[..., Path]) -> None:
    # sd_notify(3) sends to the address each time (sendmsg with msg_name): a socket bound again at the
    # same path by the next daemon is reached without the program knowing there was a restart.
    spec = make_job("longbeat", """
import os, socket, time
address = os.environ["NOTIFY_SOCKET"]
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
def notify(state):
    try:
        sock.sendto(state.encode(), address)
    except OSError:
        pass  # no daemon listening just now: sd_notify returns an error, the program goes on
end = time.monotonic() + 12
n = 0
while time.monotonic() < end:
    n += 1
    notify(f"WATCHDOG=1\\nSTATUS=tick {n}")
    time.sleep(0.2)
print("finished", flush=True)
""", extra="[health]\nsilence_s = 2.0\n[restart]\nmax_attempts = 1\n")
    # No watchdog_s: the new daemon knows it pings by its first ping's stored event, and keeps its silent
    # phase alive (it prints nothing but its last line).
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: client.status("longbeat").jobs[0].status_line, timeout=20)
    wait_until(lambda: any(e.data.get("sd_notify") == "WATCHDOG" for e in client.events("longbeat").events))
    daemon.kill()  # SIGKILL: no goodbye; the job runs on alone
    time.sleep(1.0)
    daemon.start()
    client = daemon.client()
    first = wait_until(lambda: client.status("longbeat").jobs[0].status_line, timeout=20)
    later = wait_until(lambda: (s := client.status("longbeat").jobs[0].status_line) != first and s, timeout=10)
    assert str(later).startswith("tick ")
    wait_until(lambda: finished(client, "longbeat"), timeout=40)
    attempt = client.attempts("longbeat").attempts[0]
    assert attempt.verdict == "done", attempt.reason
