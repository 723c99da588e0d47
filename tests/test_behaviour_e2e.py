"""Ordinary use, end to end through a real daemon and the real CLI: following one job among
others, a silent job judged before any phase, notes at start (a changed spec, a setting that
never applies), what a job that is not running shows, and what `stop` lists."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import CRASHING_JOB, PROGRESS_JOB, REPO, job_state, progress_done, supervise

GATED_JOB = """\
import os, sys, time
print("waiting", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.02)
"""
QUIET_JOB = "import time\ntime.sleep(600)\n"
ONE_ATTEMPT = "[restart]\nmax_attempts = 1\n"


def test_follow_returns_when_its_job_ends_while_another_job_keeps_publishing(daemon: DaemonProcess, daemon_env,
                                                                             make_job) -> None:
    # A busy job: a progress event every 50 ms for about 40 s keeps the event bus never quiet.
    busy = make_job("busy", PROGRESS_JOB, params=', "800", "0.05"')
    supervise(daemon_env, "start", str(busy))
    client = daemon.client()
    wait_until(lambda: len(client.events("busy").events) > 5)
    crashing = make_job("crashing", CRASHING_JOB, extra=ONE_ATTEMPT)
    began = time.monotonic()
    out = supervise(daemon_env, "start", str(crashing), "--follow", check=False)
    took = time.monotonic() - began
    assert out.returncode == 1, out.stdout + out.stderr
    assert "crashing failed" in out.stdout
    assert took < 15, f"--follow returned after {took:.1f}s, not when its own job ended"
    assert job_state(client, "busy") == "running"  # it returned while the other job still ran


def test_a_job_that_prints_nothing_and_reaches_no_phase_is_judged_silent(daemon: DaemonProcess, daemon_env,
                                                                        make_job) -> None:
    spec = make_job("quiet", QUIET_JOB, extra=ONE_ATTEMPT + "[health]\nsilence_s = 1\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: job_state(client, "quiet") == "failed", timeout=20)
    attempt = client.attempts("quiet").attempts[0]
    assert attempt.verdict == "silent"
    assert "before any phase" in (attempt.reason or "")


def test_start_warns_in_one_line_about_a_health_setting_that_can_never_apply(daemon: DaemonProcess, daemon_env,
                                                                           make_job, home: Path) -> None:
    gate = home / "gate"
    # The python pack recognises no vLLM phase: a deadline for cuda_graph_capture never applies.
    spec = make_job("unreached", GATED_JOB, probes='["python"]', params=f', "{gate}"',
                    extra='[health.phase_deadline_s]\ncuda_graph_capture = 60\n')
    out = supervise(daemon_env, "start", str(spec)).stdout
    notes = [line for line in out.splitlines() if "never applies" in line]
    assert len(notes) == 1, out
    assert "health.phase_deadline_s (cuda_graph_capture)" in notes[0] and "python" in notes[0]
    gate.touch()


def test_start_of_another_file_with_a_jobs_name_says_what_changed_and_carries_on(daemon: DaemonProcess,
                                                                                daemon_env, make_job,
                                                                                home: Path) -> None:
    first = make_job("twin", "print('one', flush=True)\n")
    supervise(daemon_env, "start", str(first), "--follow")
    out = supervise(daemon_env, "start", str(first), "--follow").stdout
    assert "spec changed" not in out  # the same file, unchanged: nothing to say
    assert "never applies" not in out  # the default phase settings are never reported
    other_dir = home / "other"
    other_dir.mkdir()
    second = other_dir / "twin.toml"
    second.write_text(first.read_text().replace("stop_grace_s = 2", "stop_grace_s = 3"))
    out = supervise(daemon_env, "start", str(second), "--follow").stdout
    notes = [line for line in out.splitlines() if "spec changed" in line]
    assert len(notes) == 1, out
    assert f"from {first} to {second}" in notes[0] and notes[0].endswith(": stop_grace_s")
    client = daemon.client()
    assert [a.n for a in client.attempts("twin").attempts] == [1, 2, 3]  # carried on: one history


def test_a_stopped_job_shows_no_stale_verdict_eta_or_countdown_and_a_far_countdown_is_not_shown(
        daemon: DaemonProcess, daemon_env, make_job, home: Path) -> None:
    gate = home / "gate"
    # Twenty steps 0.5 s apart, then it holds at 20/40: a rate and an ETA (10 s from its last step) while it runs.
    spec = make_job("held", PROGRESS_JOB, params=f', "40", "0.5", "{gate}"', extra="[health]\nstall_floor_s = 3600\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: (a := client.status("held").jobs[0].attempt) is not None and a.progress is not None
               and a.progress.done == 20, timeout=40)
    running = supervise(daemon_env, "status", "held").stdout
    assert "verdict healthy" in running and "eta " in running, running
    assert client.status("held").jobs[0].next_verdict is not None  # a rule is pending, an hour off...
    assert "if nothing changes" not in running, running  # ...too far to be worth a line
    out = supervise(daemon_env, "stop", "held").stdout
    # The user's command, not the wrapper's shell script, among the processes stopped.
    assert "rc=$?" not in out, out
    assert sum(str(home / "specs" / "held.py") in line for line in out.splitlines()) >= 1, out
    stopped = supervise(daemon_env, "status", "held").stdout
    assert "held: stopped" in stopped, stopped
    for stale in ("healthy", "eta ", "s/it", "if nothing changes"):
        assert stale not in stopped, stopped


def test_a_near_countdown_is_shown(daemon: DaemonProcess, daemon_env, make_job, home: Path) -> None:
    gate = home / "gate"
    spec = make_job("near", PROGRESS_JOB, params=f', "20", "0.05", "{gate}"', extra="[health]\nstall_floor_s = 50\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: (a := client.status("near").jobs[0].attempt) is not None and a.progress is not None
               and a.progress.done == 10)
    out = supervise(daemon_env, "status", "near").stdout
    assert "stalled in " in out and "if nothing changes" in out, out  # under a minute: shown
    gate.touch()


def test_status_and_follow_say_where_the_output_goes_with_one_name_per_phase(daemon: DaemonProcess, daemon_env,
                                                                            make_job, home: Path) -> None:
    spec = make_job("writer", PROGRESS_JOB, params=', "4", "0.01"', extra='outputs = ["{spec_dir}/results"]\n')
    # `extra` lands after [env]: move the top-level key above the tables.
    text = spec.read_text().replace('outputs = ["{spec_dir}/results"]\n', "")
    spec.write_text('outputs = ["{spec_dir}/results"]\n' + text)
    out = supervise(daemon_env, "start", str(spec), "--follow").stdout
    results = home / "specs" / "results"
    assert f"writer writes its output to {results}" in out, out
    phase_lines = [line.split("phase", 1)[1].strip() for line in out.splitlines() if " phase " in line]
    # Not "running: ***** Running training *****"; the phase the shard bar implied is one too.
    assert phase_lines == ["weight_loading", "running"], out
    assert f"output {results}" in supervise(daemon_env, "status", "writer").stdout


def test_a_refused_ssh_host_is_said_at_once_in_one_line(daemon: DaemonProcess, daemon_env, make_job) -> None:
    spec = make_job("remote", "print(1)\n")
    began = time.monotonic()
    result = supervise(daemon_env, "start", str(spec), "--host", "ssh://nobody@127.0.0.1:1",
                       "--python", "/usr/bin/python3", "--workdir", "/tmp", check=False)
    took = time.monotonic() - began
    assert result.returncode == 69, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "connection refused (nobody@127.0.0.1:1)" in lines[0], result.stderr
    assert took < 10, f"said after {took:.1f}s"  # the default retry budget, not a shortened one


def test_rm_of_a_waiting_job_says_it_is_waiting_not_running(daemon: DaemonProcess, daemon_env, make_job,
                                                             home: Path) -> None:
    gate = home / "gate-rm"
    first = make_job("ahead", GATED_JOB, params=f', "{gate}"')
    second = make_job("behind", "print('ran', flush=True)\n")
    supervise(daemon_env, "start", str(first))
    supervise(daemon_env, "start", str(second), "--after", "ahead")
    client = daemon.client()
    wait_until(lambda: job_state(client, "behind") == "waiting", timeout=20)
    result = supervise(daemon_env, "rm", "behind", check=False)
    assert result.returncode == 75 and "is waiting (not ended)" in result.stderr, result.stderr
    assert "is running" not in result.stderr
    gate.touch()


def test_a_long_bar_piped_to_a_file_is_a_line_per_percent_not_per_redraw(daemon: DaemonProcess, daemon_env,
                                                                          make_job) -> None:
    # 2,000 steps in about a second: piped, `start --follow` prints at most one line a percent (plus
    # one a second), and the bar's last state.
    spec = make_job("longbar", PROGRESS_JOB, params=', "2000", "0.0005"')
    out = supervise(daemon_env, "start", str(spec), "--follow").stdout
    bar = [line for line in out.splitlines() if " progress " in line]
    assert 2 <= len(bar) <= 101 + 10, (len(bar), bar[:5])
    assert " 2000/2000" in bar[-1], bar[-3:]
    done = [int(line.split(": ", 1)[1].split("/")[0]) for line in bar]
    assert done == sorted(done)  # in order, none repeated
    assert len(set(done)) == len(done)


def test_a_long_bar_followed_by_events_f_into_a_file_is_a_line_per_percent(daemon: DaemonProcess, daemon_env,
                                                                            make_job, home: Path) -> None:
    # `events -f` shares `start --follow`'s printer; here it is a pipe into a real file, attached
    # before the bar's second half (2,000 steps, about a second) runs past it.
    gate = home / "gate-bar"
    spec = make_job("pipedbar", PROGRESS_JOB, params=f', "2000", "0.0005", "{gate}"')
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: progress_done(client, "pipedbar") >= 1000, timeout=30)
    out_path = home / "events.out"
    with out_path.open("w") as out:
        follower = subprocess.Popen([sys.executable, "-m", "supervisor.cli", "events", "pipedbar", "-f"],
                                    env=daemon_env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            wait_until(lambda: " progress " in out_path.read_text(), timeout=30)
            gate.touch()
            wait_until(lambda: " 2000/2000" in out_path.read_text(), timeout=30)
        finally:
            follower.terminate()
            follower.wait(timeout=10)
    bar = [line for line in out_path.read_text().splitlines() if " progress " in line]
    assert 2 <= len(bar) <= 101 + 10, (len(bar), bar[:5])
    done = [int(line.split(": ", 1)[1].split("/")[0]) for line in bar]
    assert done == sorted(done) and len(set(done)) == len(done), done
    assert done[-1] == 2000
