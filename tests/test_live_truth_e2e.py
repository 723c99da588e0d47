"""What the live views say of a running job is true now, not as of the bar's last step: a bar
stood still past its ETA shows how long it has stood still, an ended attempt shows no ETA.  A real
daemon, real jobs, the real CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import NamedTuple

from conftest import DaemonProcess, wait_until
from e2e_jobs import CR_BAR_JOB, PROGRESS_JOB, REPO, supervise


def _held_at_half(daemon: DaemonProcess, daemon_env, make_job, home: Path, name: str) -> Path:
    """A bar of 20 steps 0.1 s apart, held at 10/20 (ETA about 1 s at its last step) until ``gate`` exists."""
    gate = home / f"{name}-gate"
    spec = make_job(name, PROGRESS_JOB, params=f', "20", "0.1", "{gate}"', extra="[health]\nstall_floor_s = 3600\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: (a := client.status(name).jobs[0].attempt) is not None and a.progress is not None
               and a.progress.done == 10)
    return gate


def test_a_bar_still_past_its_eta_shows_how_long_it_has_been_still_not_an_eta(daemon: DaemonProcess, daemon_env,
                                                                               make_job, home: Path) -> None:
    gate = _held_at_half(daemon, daemon_env, make_job, home, "held")
    time.sleep(3)  # three times the ETA its last step gave
    out = supervise(daemon_env, "status", "held").stdout
    progress = next(line for line in out.splitlines() if "progress " in line)
    assert "eta" not in progress, out
    still = re.search(r"still (\d+(?:\.\d)?)s", progress)
    assert still and 2.5 <= float(still.group(1)) < 30, out
    shown = json.loads(supervise(daemon_env, "status", "held", "--json").stdout)["jobs"][0]["attempt"]["progress"]
    assert shown["eta_s"] is None and shown["still_s"] >= 2.5, shown
    supervise(daemon_env, "stop", "held")
    stopped = json.loads(supervise(daemon_env, "status", "held", "--json").stdout)["jobs"][0]["attempt"]["progress"]
    assert stopped["eta_s"] is None and stopped["still_s"] is None, stopped  # an ended attempt: neither
    gate.touch()


def test_a_moving_bar_counts_its_eta_down_from_its_last_step(daemon: DaemonProcess, daemon_env, make_job,
                                                             home: Path) -> None:
    gate = home / "slow-gate"
    # 40 steps 0.5 s apart, held at 20/40: an ETA of about 10 s at its last step.
    spec = make_job("slow", PROGRESS_JOB, params=f', "40", "0.5", "{gate}"', extra="[health]\nstall_floor_s = 3600\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: (a := client.status("slow").jobs[0].attempt) is not None and a.progress is not None
               and a.progress.done >= 20, timeout=60)
    time.sleep(2)  # 2 s of that ETA gone
    shown = json.loads(supervise(daemon_env, "status", "slow", "--json").stdout)["jobs"][0]["attempt"]["progress"]
    assert shown["done"] == 20 and shown["still_s"] >= 2, shown
    assert shown["eta_s"] is not None and shown["eta_s"] <= 20 * shown["rate_s_per_it"] - 2 + 0.01, shown
    gate.touch()


def _log_stamps(client, job: str) -> list[tuple[str, float | None, bool]]:
    return [(c.text, c.ts, c.partial) for c in client.follow_log(job, attempt=None, follow=False, timestamps=True)
            if not c.end]


class Frozen(NamedTuple):
    """A bar held at 4/8 and the log's stamps asked for twice while it stood there."""
    gate: Path  # touched: the bar goes on
    frozen_at: float  # when `status` first showed it at 4/8
    first: list[tuple[str, float | None, bool]]
    second: list[tuple[str, float | None, bool]]


def _asked_twice(daemon: DaemonProcess, daemon_env, make_job, home: Path, name: str, job: str,
                 first_after_s: float, second_after_s: float) -> Frozen:
    gate = home / f"{name}-gate"
    spec = make_job(name, job, params=f', "{gate}"', extra="[health]\nstall_floor_s = 3600\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: (a := client.status(name).jobs[0].attempt) is not None and a.progress is not None
               and a.progress.done == 4)
    frozen_at = time.time()
    time.sleep(first_after_s)
    first = _log_stamps(client, name)
    time.sleep(second_after_s)
    return Frozen(gate, frozen_at, first, _log_stamps(client, name))


def test_a_frozen_bars_last_redraw_keeps_the_time_it_arrived(daemon: DaemonProcess, daemon_env, make_job,
                                                              home: Path) -> None:
    gate, frozen_at, first, second = _asked_twice(daemon, daemon_env, make_job, home, "frozen", CR_BAR_JOB, 2.5, 1.5)
    assert first == second, (first, second)  # the same redraw, the same time, whenever asked
    text, ts, _ = first[-1]
    assert "4/8" in text and ts is not None and ts <= frozen_at + 1, (first[-1], frozen_at)
    gate.touch()


# A bar drawn as `print(..., end="\r")` draws it: each redraw ENDS with its carriage return, so the
# frozen one's last byte is a `\r` the reader holds (it may be the first half of a `\r\n`).
TRAILING_CR_BAR_JOB = """\
import os, sys, time
gate = sys.argv[1]
for i in range(1, 9):
    print(f"Loading checkpoint shards: {100 * i // 8}%|###| {i}/8 [00:00<00:01, 5.0it/s]", end="\\r", flush=True)
    time.sleep(0.05)
    while i == 4 and not os.path.exists(gate):
        time.sleep(0.01)
"""


def test_a_frozen_bar_drawn_with_trailing_carriage_returns_keeps_its_time_while_running_and_after(
        daemon: DaemonProcess, daemon_env, make_job, home: Path) -> None:
    _, frozen_at, first, second = _asked_twice(daemon, daemon_env, make_job, home, "trailing", TRAILING_CR_BAR_JOB,
                                               1.5, 1.5)
    assert first == second, (first, second)  # the same redraw, the same time, whenever asked
    text, ts, _ = first[-1]
    assert "4/8" in text and ts is not None and ts <= frozen_at + 1, (first[-1], frozen_at)
    supervise(daemon_env, "stop", "trailing")
    ended = _log_stamps(daemon.client(), "trailing")
    frozen = {(t, at) for t, at, _ in ended if "4/8" in t}
    assert frozen == {(text, ts)}, ended  # an ended attempt's last redraw keeps the time it arrived, not none


# The same bar written unbuffered: its text and its `\r` are two writes, so a read can take the text
# (completing the redraw before it) and the next the lone `\r`, which completes no record.
SPLIT_CR_BAR_JOB = """\
import os, sys, time
gate = sys.argv[1]
for i in range(1, 9):
    os.write(1, f"Loading checkpoint shards: {100 * i // 8}%|###| {i}/8 [00:00<00:01, 5.0it/s]".encode())
    time.sleep(0.05)
    os.write(1, b"\\r")
    time.sleep(0.05)
    while i == 4 and not os.path.exists(gate):
        time.sleep(0.01)
"""


def test_a_frozen_bars_carriage_return_written_on_its_own_is_dated_when_it_came_not_when_asked(
        daemon: DaemonProcess, daemon_env, make_job, home: Path) -> None:
    frozen = _asked_twice(daemon, daemon_env, make_job, home, "split", SPLIT_CR_BAR_JOB, 1.5, 1.5)
    assert frozen.first == frozen.second, frozen  # no line dated by the query that asked for it
    frozen.gate.touch()


# A slow bar drawn as tqdm draws it: each redraw's `\r` comes BEFORE its text, so a redraw's record is
# ended by the next redraw's write, a step later.  Each redraw says when it was written.
SLOW_LEADING_CR_BAR_JOB = """\
import sys, time
for i in range(1, 4):
    sys.stdout.write(f"\\rLoading checkpoint shards: {i}/8 written at {time.time():.3f}")
    sys.stdout.flush()
    time.sleep(3.0 if i < 3 else 3600)
"""


def test_each_redraw_of_a_slow_bar_is_dated_when_it_was_written_not_by_the_next(
        daemon: DaemonProcess, daemon_env, make_job) -> None:
    spec = make_job("slowbar", SLOW_LEADING_CR_BAR_JOB, extra="[health]\nstall_floor_s = 3600\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: any("3/8" in text for text, _, _ in _log_stamps(client, "slowbar")), timeout=30)
    time.sleep(1.5)  # the last redraw's arrival noted (the log gone quiet)
    dated = [(float(text.rsplit(" ", 1)[1]), ts) for text, ts, partial in _log_stamps(client, "slowbar")
             if "written" in text and not partial]  # (the tail comes twice: as it stands, then as the last line)
    assert len(dated) == 3, dated
    # Arrival marks are kept to the second: a redraw's time is at most about a second after it was
    # written (and never before), not the 3 s later when the next redraw ended its record.
    assert all(ts is not None and written - 0.01 <= ts < written + 1.9 for written, ts in dated), dated
    supervise(daemon_env, "stop", "slowbar")


def test_piped_logs_follow_prints_a_frozen_bars_latest_redraw_once(daemon: DaemonProcess, daemon_env, make_job,
                                                                   home: Path) -> None:
    gate = home / "piped-gate"
    spec = make_job("piped", CR_BAR_JOB, params=f', "{gate}"', extra="[health]\nstall_floor_s = 3600\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: (a := client.status("piped").jobs[0].attempt) is not None and a.progress is not None
               and a.progress.done == 4)
    # `supervise logs piped -f | cat`, as over `ssh box` without a terminal.
    lines: list[str] = []
    with subprocess.Popen([sys.executable, "-m", "supervisor.cli", "logs", "piped", "-f"], env=daemon_env,
                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=REPO) as proc:
        out = proc.stdout
        assert out is not None
        reader = threading.Thread(target=lambda: lines.extend(iter(out.readline, "")), daemon=True)
        reader.start()
        try:
            # Where the bar stands, while it stands there: not one redraw behind.
            wait_until(lambda: lines and "4/8" in lines[-1], timeout=15)
            gate.touch()
            proc.wait(timeout=30)  # the job ends: so does the follow
        finally:
            proc.kill()
            reader.join(timeout=10)
    assert sum("4/8" in line for line in lines) == 1, lines  # printed once it settled, not again once complete
    assert "8/8" in "".join(lines), lines


# A bar at 1.67 s/it (tqdm's own rate text) that holds at 2/8 until the gate exists.
ODD_RATE_BAR = """\
import os, sys, time
gate = sys.argv[1]
for i in range(1, 9):
    print(f"Loading checkpoint shards: {100 * i // 8}%|###| {i}/8 [00:0{i}<00:10,  1.67s/it]", flush=True)
    time.sleep(0.1)
    while i == 2 and not os.path.exists(gate):
        time.sleep(0.01)
"""


def test_a_floor_set_in_the_spec_is_named_and_figures_are_rounded(daemon: DaemonProcess, daemon_env, make_job,
                                                                  home: Path) -> None:
    gate = home / "floor-gate"
    spec = make_job("floored", ODD_RATE_BAR, params=f', "{gate}"',
                    extra="[health]\nstall_floor_s = 600\nstall_floor_by_phase = { startup = 30 }\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: client.status("floored").jobs[0].stall_bounds)
    out = supervise(daemon_env, "status", "floored").stdout
    assert re.search(r"stall bound 10m00s \(stall_floor_s\) for .*, 9m5\ds left", out), out
    [bound] = json.loads(supervise(daemon_env, "status", "floored", "--json").stdout)["jobs"][0]["stall_bounds"]
    assert bound["bound_s"] == 600.0 and bound["source"] == "stall_floor_s", bound
    events = supervise(daemon_env, "events", "floored", "--kind", "progress").stdout
    assert "rate=0.5988" in events and "0.598802" not in events, events
    gate.touch()


def test_follow_says_a_failure_once_an_attempt(daemon: DaemonProcess, daemon_env, make_job) -> None:
    spec = make_job("hello", "print('step 0', flush=True)\nraise RuntimeError('the data file is missing')\n",
                    extra="[restart]\nmax_attempts = 2\nbackoff_initial_s = 0.2\nbackoff_jitter_s = 0\n")
    out = supervise(daemon_env, "start", str(spec), "--follow", check=False).stdout
    for n in (1, 2):
        lines = [line for line in out.splitlines() if f" #{n} " in line]
        said = [line for line in lines if "the data file is missing" in line]
        assert len(said) == 1 and " failure " in said[0], out  # the failure line; the verdict and state do not repeat it
        assert any(" verdict  crashed: exited 1" in line for line in lines), out
    assert "#1 state    backoff\n" in out + "\n", out


def test_a_stop_leaves_the_bars_line_as_the_job_left_it(daemon: DaemonProcess, daemon_env, make_job,
                                                        home: Path) -> None:
    gate = home / "stop-gate"
    spec = make_job("stopped", CR_BAR_JOB, params=f', "{gate}"', extra="[health]\nstall_floor_s = 3600\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: (a := client.status("stopped").jobs[0].attempt) is not None and a.progress is not None
               and a.progress.done == 4)
    supervise(daemon_env, "stop", "stopped")
    log = Path(client.attempts("stopped").attempts[0].log_path).read_bytes()
    assert log.endswith(b"4/8 [00:00<00:01, 5.0it/s]"), log[-200:]  # nothing of the wrapper's on the bar's line


# A loader thread's traceback, then the bar goes on to its end and the program exits 0: recovered.
RECOVERING = """\
import sys, time
print("Traceback (most recent call last):", flush=True)
print('  File "loader.py", line 3, in fetch', flush=True)
print("ConnectionError: shard mirror timed out", flush=True)
for i in range(1, 5):
    print(f"Loading checkpoint shards: {25 * i}%|###| {i}/4 [00:00<00:01, 5.0it/s]", flush=True)
    time.sleep(0.05)
"""


def test_a_recovered_failure_is_called_recovered_by_status_and_probe(daemon: DaemonProcess, daemon_env, make_job,
                                                                     home: Path) -> None:
    spec = make_job("recovers", RECOVERING)
    supervise(daemon_env, "start", str(spec), "--follow")
    client = daemon.client()
    [attempt] = client.attempts("recovers").attempts
    assert attempt.verdict == "done", attempt.reason
    status = supervise(daemon_env, "status", "recovers").stdout
    assert "  recovered other: ConnectionError: shard mirror timed out" in status and "failure " not in status, status
    report = supervise(daemon_env, "probe", attempt.log_path).stdout
    assert "recovered: other  (fingerprint " in report and "failure: none" not in report, report
    assert "  ConnectionError: shard mirror timed out" in report, report


def test_a_phase_a_bar_implies_is_stored_as_a_phase_event(daemon: DaemonProcess, daemon_env, make_job) -> None:
    # No line announces weight_loading: the shard bar implies it (as `status` says); then a phase line.
    spec = make_job("implied", PROGRESS_JOB, params=', "6", "0.02"')
    supervise(daemon_env, "start", str(spec), "--follow")
    phases = [(e.phase, e.data.get("implied_by")) for e in daemon.client().events("implied").events if e.kind == "phase"]
    assert phases == [("weight_loading", "progress"), ("running", None)], phases  # each once, in order
    out = supervise(daemon_env, "events", "implied", "--kind", "phase").stdout
    assert "phase    weight_loading" in out, out
