"""A death by a signal from outside (an admin's `kill -9`, a reaper, a flaky node) says nothing
about the program: it is relaunched until `max_attempts`, never taken for "the same bug twice".
A real daemon, a real job SIGKILLed from outside on each attempt, the real launch wrapper's
`Killed` line; and torchrun's report of a SIGKILLed rank replayed through the real watchdog."""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Callable
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise
from probe_helpers import events_of

from supervisor.core.actions import ActionKind
from supervisor.core.events import Event, EventKind, FailureKind, Verdict
from supervisor.hosts.base import KILLED_LINE
from supervisor.jobs.policy import RestartPolicy
from supervisor.spec.tables import HealthSpec, RestartSpec
from supervisor.watchdog import Watchdog

DEVICE = Path(__file__).parent / "data" / "corpus" / "device-logs"

# Steps until killed; its pid is written once it has printed its first step.
VICTIM = """\
import os, sys, time
pid_dir = sys.argv[1]
print("step 0/10000 loss 1.0", flush=True)
with open(os.path.join(pid_dir, "pid.tmp"), "w") as f:
    f.write(str(os.getpid()))
os.rename(os.path.join(pid_dir, "pid.tmp"), os.path.join(pid_dir, f"pid-{os.getpid()}"))
for step in range(1, 10_000):
    print(f"step {step}/10000 loss 1.0", flush=True)
    time.sleep(0.1)
"""


def _kill_next(pid_dir: Path, seen: set[str], ended: Callable[[], bool]) -> bool:
    """SIGKILL the next attempt's program, as an admin's `kill -9` would; False when the job
    ended instead of launching another attempt."""
    found = wait_until(lambda: [p for p in pid_dir.glob("pid-*") if p.name not in seen] or ended(), timeout=30)
    if found is True:
        return False
    assert isinstance(found, list)
    (path,) = found
    seen.add(path.name)
    os.kill(int(path.name.removeprefix("pid-")), signal.SIGKILL)
    return True


def test_outside_sigkills_are_relaunched_until_max_attempts(daemon: DaemonProcess, daemon_env, make_job,
                                                             home: Path) -> None:
    pid_dir = home / "pids"
    pid_dir.mkdir()
    spec = make_job("victim", VICTIM, params=f', "{pid_dir}"',
                    extra="[restart]\nmax_attempts = 4\nbackoff_initial_s = 0\nbackoff_jitter_s = 0\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    seen: set[str] = set()
    for _ in range(4):
        if not _kill_next(pid_dir, seen, lambda: job_state(client, "victim") == "failed"):
            break
    wait_until(lambda: job_state(client, "victim") == "failed", timeout=60)
    attempts = client.attempts("victim").attempts
    assert [a.n for a in attempts] == [1, 2, 3, 4]
    # The wrapper's `Killed` line was read as a failure each time, with the same fingerprint...
    assert all(a.verdict == "killed" for a in attempts), [(a.verdict, a.reason) for a in attempts]
    assert len({a.fingerprint for a in attempts}) == 1 and attempts[0].fingerprint is not None, [(a.fingerprint, a.failure) for a in attempts]
    assert attempts[0].failure is not None and attempts[0].failure.line == KILLED_LINE
    # ...yet nothing called it a bug: the budget ended the run.
    status = supervise(daemon_env, "status", "victim", check=False).stdout
    assert "deterministic" not in status, status
    assert "attempt 4/4 failed: giving up" in status, status


def _judge_replayed(log: Path) -> tuple[Verdict, str | None, FailureKind | None]:
    """The verdict, fingerprint and failure kind the watchdog gives a finished log (exit 1)."""
    watchdog = Watchdog(HealthSpec(), clock=lambda: 0.0)
    for event in events_of(log.read_bytes()):
        watchdog.observe(Event(job="j", attempt=1, kind=EventKind(event.kind.value), message=event.line,
                               probe=event.probe, phase=event.phase, data=event.fields, failure=event.failure))
    judgement = watchdog.exited(1, None, killed_by_us=False)
    failure = watchdog.failure
    return judgement.verdict, failure.fingerprint if failure else None, failure.kind if failure else None


def test_a_torchrun_rank_sigkilled_twice_is_relaunched_and_a_ranks_own_exception_twice_is_not() -> None:
    policy = RestartPolicy(RestartSpec(max_attempts=4), rng=random.Random(0))
    verdict, fingerprint, kind = _judge_replayed(DEVICE / "run-torchrun-rank0-sigkill.log")
    assert fingerprint is not None and kind is FailureKind.KILLED
    decision = policy.decide(verdict, 2, fingerprint, fingerprint, kind)
    assert decision.action is ActionKind.RELAUNCH, decision.reason
    assert "attempt 3/4" in decision.reason
    assert policy.decide(verdict, 4, fingerprint, fingerprint, kind).reason == "attempt 4/4 failed: giving up"
    # A rank's own ValueError, the same twice, is still the program's bug.
    verdict, fingerprint, kind = _judge_replayed(DEVICE / "run-torchrun-rank1-valueerror-startup.log")
    decision = policy.decide(verdict, 2, fingerprint, fingerprint, kind)
    assert decision.action is ActionKind.GIVE_UP and "deterministic bug" in decision.reason


# argv: shard, num_shards.  Shards 0 and 1 are SIGKILLed (as a node's reaper would) on their first
# attempt and end well on their second; shard 2 ends well at once.
REAPED_SHARD = """\
import os, signal, sys
shard, marks = int(sys.argv[1]), sys.argv[3]
print(f"shard {shard} starting", flush=True)
mark = os.path.join(marks, f"reaped-{shard}")
if shard < 2 and not os.path.exists(mark):
    open(mark, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
print(f"shard {shard} done", flush=True)
"""


def test_two_shards_sigkilled_from_outside_do_not_stop_the_job(daemon: DaemonProcess, daemon_env,
                                                               home: Path) -> None:
    marks = home / "marks"
    marks.mkdir()
    specs = home / "specs"
    specs.mkdir()
    (specs / "reaped.py").write_text(REAPED_SHARD)
    spec = specs / "reaped.toml"
    spec.write_text(f'name = "reaped"\ncommand = ["{{python}}", "{specs}/reaped.py", "{{shard}}", "{{num_shards}}", '
                    f'"{marks}"]\nprobes = ["python"]\nstop_grace_s = 2\nshards = 3\n'
                    "[restart]\nmax_attempts = 3\nbackoff_initial_s = 0.1\nbackoff_jitter_s = 0\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: job_state(client, "reaped") in ("done", "failed"), timeout=60)
    job = client.status("reaped").jobs[0]
    assert job.state == "done", job.reason
    attempts = client.attempts("reaped").attempts
    killed = [a for a in attempts if a.verdict == "killed"]
    assert sorted(a.shard for a in killed) == [0, 1]
    assert killed[0].fingerprint == killed[1].fingerprint is not None  # the same line, yet not the code's
