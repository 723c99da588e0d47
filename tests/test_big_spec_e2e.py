"""A spec just under the 1 MiB limit (20,000 `env` entries) is parsed, compared with the one the
job last ran with, and expanded off the daemon's loop: `status` keeps answering meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state

from supervisor.core.textfile import MAX_INPUT_BYTES

# Far above what any status takes on a loaded machine; far below what the loop was held for
# (expanding the env took 2.8 s per launch, comparing it with the stored one minutes).
STATUS_BOUND_S = 1.5


def _big_spec(home: Path) -> Path:
    lines = ['name = "big"', 'command = ["/bin/sleep", "60"]', "stop_grace_s = 1", "[env]"]
    entry = 0
    while sum(len(line) + 1 for line in lines) < MAX_INPUT_BYTES - 100:
        lines.append(f'V{entry} = "{"x" * 40}"')
        entry += 1
    spec = home / "big.toml"
    spec.write_text("\n".join(lines[:-1]) + "\n")
    assert MAX_INPUT_BYTES - 200 < spec.stat().st_size <= MAX_INPUT_BYTES
    return spec


def _slowest_status_while(daemon: DaemonProcess, action) -> float:
    """Run ``action`` in a thread; ask `status` over and over until it is done: the slowest answer."""
    done = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
        finally:
            done.set()

    watcher = daemon.client()
    thread = threading.Thread(target=run)
    thread.start()
    slowest = 0.0
    while not done.is_set():
        asked = time.monotonic()
        watcher.status()
        slowest = max(slowest, time.monotonic() - asked)
    thread.join()
    if errors:
        raise errors[0]
    return slowest


def test_a_spec_near_the_size_limit_does_not_stop_the_daemon(daemon: DaemonProcess, home: Path) -> None:
    spec = _big_spec(home)
    client = daemon.client()
    slowest = _slowest_status_while(daemon, lambda: client.start(str(spec), {}))
    assert slowest < STATUS_BOUND_S, f"status took {slowest:.2f}s while the spec was started"
    wait_until(lambda: client.status("big").jobs[0].attempt.pid)
    client.stop("big", None)
    wait_until(lambda: job_state(client, "big") == "stopped")
    # Started again: compared with the spec it last ran with (which fields changed), then launched.
    slowest = _slowest_status_while(daemon, lambda: client.start(str(spec), {}))
    assert slowest < STATUS_BOUND_S, f"status took {slowest:.2f}s while the spec was started again"
    assert job_state(client, "big") == "running"
