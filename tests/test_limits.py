"""`[limits]` (memory_max, cpu_max, tasks_max): the spec's values checked one line each through the
real CLI, written to an attempt's cgroup in the kernel's own formats, read back as the kernel reports
an enforced limit, and judged `oom` / `limit` with the figure.

The cgroup files here are a fake of the kernel's interface files in a temporary directory (this
machine has no writable cgroup v2 with controllers); the same code meets the real ones in
tests/test_limits_e2e.py where the machine has them."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import supervise

from supervisor.cli.views import status_block
from supervisor.core.errors import LaunchError, SpecError
from supervisor.core.events import AttemptState, FailureKind, JobState, Verdict
from supervisor.core.protocol import AttemptInfo, FailureInfo, JobStatus
from supervisor.core.resource_limits import Controller, LimitHit, LimitKind, ResourceLimits, refusal
from supervisor.hosts.base import KILLED_LINE, WRAPPER_SH, LaunchRequest
from supervisor.hosts.local import cgroup
from supervisor.hosts.local.cgroup import Containment, ContainmentKind
from supervisor.hosts.local.host import LocalHost
from supervisor.jobs.policy import RestartPolicy
from supervisor.spec.model import load_spec
from supervisor.spec.tables import HealthSpec, LimitsSpec, RestartSpec
from supervisor.watchdog import Watchdog

BAD_VALUES = [
    ('memory_max = "80%"', "limits.memory_max", "not a share of the machine's memory"),
    ('memory_max = "lots"', "limits.memory_max", 'a size such as "8G" or "512MiB"'),
    ("memory_max = 1000", "limits.memory_max", "between 1M and 1024P"),
    (f'memory_max = "{"9" * 400}G"', "limits.memory_max", 'a size such as "8G" or "512MiB"'),
    (f'cpu_max = "{"9" * 400}%"', "limits.cpu_max", "between 1% and 100000%"),
    ("memory_max = true", "limits.memory_max", 'a size such as "8G"'),
    ('cpu_max = "2"', "limits.cpu_max", 'such as "200%" for two cores'),
    ('cpu_max = "0%"', "limits.cpu_max", "between 1% and 100000%"),
    ("cpu_max = 2", "limits.cpu_max", 'such as "200%"'),
    ("tasks_max = true", "limits.tasks_max", "a whole number of tasks"),
    ("tasks_max = 0", "limits.tasks_max", "between 1 and 4194304"),
    ('tasks_max = "64"', "limits.tasks_max", "a whole number of tasks"),
    ("memmax = 1", "limits.memmax", "did you mean 'memory_max'?"),
]


def test_each_bad_limit_is_one_line_naming_the_field(tmp_path: Path) -> None:
    spec = tmp_path / "capped.toml"
    for line, field, said in BAD_VALUES:
        spec.write_text(f'command = ["true"]\n[limits]\n{line}\n')
        with pytest.raises(SpecError) as caught:
            load_spec(spec)
        message = str(caught.value)
        assert caught.value.exit_code == 65 and len(message.splitlines()) == 1, message
        assert f"field '{field}'" in message and said in message, message
    for host, hint in (("ssh://box", "remove [limits]"), ("slurm:", "--mem=8G")):
        spec.write_text(f'command = ["true"]\nhost = "{host}"\npython = "/usr/bin/python3"\nworkdir = "/tmp"\n'
                        "[limits]\ntasks_max = 8\n")
        with pytest.raises(SpecError, match=r"`\[limits\]` needs a local job") as caught:
            load_spec(spec)
        assert hint in str(caught.value)


def test_start_refuses_a_bad_limit_with_exit_65_and_the_daemon_stores_nothing(
        daemon: DaemonProcess, daemon_env: dict[str, str], tmp_path: Path) -> None:
    spec = tmp_path / "capped.toml"
    spec.write_text('command = ["true"]\n[limits]\nmemory_max = "lots"\n')
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65 and len(result.stderr.strip().splitlines()) == 1, result
    assert "field 'limits.memory_max'" in result.stderr
    spec.write_text('command = ["true"]\nhost = "ssh://box"\npython = "/usr/bin/python3"\nworkdir = "/tmp"\n'
                    "[limits]\ntasks_max = 8\n")
    result = supervise(daemon_env, "start", str(spec), check=False)
    assert result.returncode == 65 and "`[limits]` needs a local job" in result.stderr, result
    assert daemon.client().ping() is not None and not daemon.client().status().jobs  # alive, and nothing stored


def test_sizes_and_percentages_read_as_systemd_reads_them() -> None:
    limits = LimitsSpec(memory_max="512M", cpu_max="150%", tasks_max=64).resource_limits()
    assert limits == ResourceLimits(memory_max_bytes=512 << 20, cpu_max_percent=150.0, tasks_max=64)
    assert LimitsSpec(memory_max="8GiB").resource_limits() == ResourceLimits(memory_max_bytes=8 << 30)
    assert LimitsSpec(memory_max=" 1.5g ").resource_limits() == ResourceLimits(memory_max_bytes=3 << 29)
    assert LimitsSpec().resource_limits() is None
    # The kernel's formats: cpu.max is "quota period"; the wrapper's shell is not counted against tasks_max.
    assert limits.cgroup_files() == {"memory.max": str(512 << 20), "memory.swap.max": "0",
                                     "cpu.max": "150000 100000", "pids.max": "65"}
    assert limits.controllers() == {Controller.MEMORY, Controller.CPU, Controller.PIDS}


def test_the_refusal_names_the_missing_controllers_and_what_to_do() -> None:
    limits = ResourceLimits(memory_max_bytes=1 << 30, tasks_max=8)
    said = refusal(limits, frozenset({Controller.PIDS}), "no cgroup v2 hierarchy is mounted")
    assert said is not None and "with the memory controller" in said and "no cgroup v2 hierarchy is mounted" in said
    assert "remove [limits]" in said and "Delegate=yes" in said and "cgroup_root" in said
    assert refusal(limits, frozenset(Controller), "") is None


def _fake_cgroup(path: Path, files: dict[str, str]) -> Path:
    """A directory standing in for an attempt's cgroup: its interface files, as the kernel words them."""
    path.mkdir()
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def test_limits_are_written_before_anything_enters(tmp_path: Path) -> None:
    group = tmp_path / "job.1.abc"
    # The kernel makes the interface files with the cgroup; here the fake's are made empty beforehand.
    limits = ResourceLimits(memory_max_bytes=64 << 20, cpu_max_percent=50, tasks_max=8)
    real_mkdir = Path.mkdir

    def mkdir_with_files(self: Path, *args: object, **kwargs: object) -> None:
        real_mkdir(self, *args, **kwargs)  # type: ignore[arg-type]
        if self == group:
            for name in ("memory.max", "memory.swap.max", "cpu.max", "pids.max"):
                (self / name).write_text("max\n")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Path, "mkdir", mkdir_with_files)
        cgroup.create(group, limits)
    assert (group / "memory.max").read_text() == str(64 << 20)
    assert (group / "cpu.max").read_text() == "50000 100000"
    assert (group / "pids.max").read_text() == "9"


def test_a_limit_that_cannot_be_written_fails_the_launch_and_leaves_no_cgroup(tmp_path: Path) -> None:
    group = tmp_path / "job.1.abc"
    with pytest.raises(OSError):  # no memory.max: the controller is not there
        cgroup.create(group, ResourceLimits(memory_max_bytes=64 << 20))
    assert not group.exists()


def test_an_enforced_limit_is_read_back_with_its_figure(tmp_path: Path) -> None:
    memory = _fake_cgroup(tmp_path / "m", {"memory.max": f"{64 << 20}\n", "pids.max": "max\n",
                                          "memory.events": "low 0\nhigh 0\nmax 41\noom 1\noom_kill 1\noom_group_kill 0\n"})
    assert cgroup.limit_hit(memory) == LimitHit(LimitKind.MEMORY, 64 << 20, 1)
    tasks = _fake_cgroup(tmp_path / "t", {"memory.max": "max\n", "pids.max": "9\n", "pids.events": "max 3\n",
                                         "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"})
    assert cgroup.limit_hit(tasks) == LimitHit(LimitKind.TASKS, 8, 3)
    # A machine-wide OOM kill in an attempt with a memory limit it never reached is not its limit's doing.
    host_oom = _fake_cgroup(tmp_path / "h", {"memory.max": f"{64 << 20}\n", "memory.events": "max 0\noom 0\noom_kill 1\n"})
    assert cgroup.limit_hit(host_oom) is None
    assert cgroup.limit_hit(None) is None and cgroup.limit_hit(tmp_path / "gone") is None


def test_a_job_killed_by_its_memory_limit_is_oom_with_the_figure() -> None:
    hit = LimitHit(LimitKind.MEMORY, 512 << 20, 1)
    judgement = Watchdog(HealthSpec()).exited(137, signal.SIGKILL, killed_by_us=False,
                                              kernel_oom="cgroup memory.events: oom_kill 1", limit_hit=hit)
    assert judgement.verdict is Verdict.OOM
    assert judgement.reason == "killed by its memory limit 512 MiB (memory.events oom_kill 1); killed by SIGKILL"
    assert judgement.evidence.to_json()["limit"] == "memory_max" and judgement.evidence.to_json()["limit_value"] == 512 << 20
    # A worker killed, the program exiting 1 of it: still its memory limit.
    assert Watchdog(HealthSpec()).exited(1, None, killed_by_us=False, limit_hit=hit).verdict is Verdict.OOM
    # A program that went on and finished despite it: done.
    assert Watchdog(HealthSpec()).exited(0, None, killed_by_us=False, limit_hit=hit).verdict is Verdict.DONE


def test_a_job_refused_forks_by_its_task_limit_is_judged_limit_and_not_relaunched() -> None:
    judgement = Watchdog(HealthSpec()).exited(1, None, killed_by_us=False, limit_hit=LimitHit(LimitKind.TASKS, 8, 3))
    assert judgement.verdict is Verdict.LIMIT
    assert judgement.reason == "exited 1 after its task limit 8 (pids.events max 3: forks refused)"
    decision = RestartPolicy(RestartSpec()).decide(Verdict.LIMIT, 1, None, None)
    assert "limit is not a verdict to relaunch on" in decision.reason


def test_status_gives_the_limit_beside_the_failure_the_log_echoes() -> None:
    attempt = AttemptInfo(job="hog", n=1, state=AttemptState.ENDED, host="local", pid=42, started=0.0, ended=1.0,
                          exit_code=137, exit_signal=9, log_path="/tmp/attempt-1.log", phase=None, progress=None,
                          verdict=Verdict.OOM, failure=FailureInfo(kind=FailureKind.KILLED, line=KILLED_LINE),
                          reason="killed by its memory limit 64 MiB (memory.events oom_kill 1); killed by SIGKILL",
                          fingerprint=None, action="oom: giving up", argv=["python", "hog.py"])
    block = status_block(JobStatus(name="hog", state=JobState.FAILED, reason="oom", host="local", max_attempts=1,
                                   attempt=attempt)).splitlines()
    assert f"  failure killed: {KILLED_LINE}" in block
    assert "  reason killed by its memory limit 64 MiB (memory.events oom_kill 1); killed by SIGKILL" in block
    # A crash whose reason is its failure's line says it once.
    crashed = attempt.model_copy(update={"verdict": Verdict.CRASHED, "reason": f"exited 1: {KILLED_LINE}"})
    block = status_block(JobStatus(name="hog", state=JobState.FAILED, reason="crashed", host="local", max_attempts=1,
                                   attempt=crashed)).splitlines()
    assert not [line for line in block if line.startswith("  reason ")], block


def test_a_relaunch_where_the_limits_cannot_be_enforced_fails_its_launch_and_runs_nothing(tmp_path: Path) -> None:
    # A daemon started since with another cgroup_root, or none: the attempt never runs without its limits.
    host = LocalHost(tmp_path / "logs", containment=Containment(ContainmentKind.TAG, "no cgroup v2 hierarchy is mounted"))
    marker = tmp_path / "ran"
    request = LaunchRequest(argv=["/bin/sh", "-c", f"touch {marker}"], workdir=str(tmp_path), env={},
                            log_path=str(tmp_path / "logs" / "a.log"), status_path=str(tmp_path / "logs" / "a.status"),
                            tag="capped.1.0123456789", limits=ResourceLimits(memory_max_bytes=64 << 20))
    with pytest.raises(LaunchError, match=r"\[limits\] needs a writable cgroup v2 with the memory controller .*"
                                          r"no cgroup v2 hierarchy is mounted"):
        asyncio.run(host.launch(request))
    assert not marker.exists()


def test_how_long_cpu_max_held_the_attempt_back_is_read_where_it_has_one(tmp_path: Path) -> None:
    limited = _fake_cgroup(tmp_path / "c", {"cpu.max": "50000 100000\n", "cpu.stat": "usage_usec 1500000\n"
                                            "nr_periods 30\nnr_throttled 29\nthrottled_usec 1450000\n"})
    assert cgroup.cpu_throttled_s(limited) == 1.45
    free = _fake_cgroup(tmp_path / "f", {"cpu.max": "max 100000\n", "cpu.stat": "usage_usec 1\nthrottled_usec 0\n"})
    assert cgroup.cpu_throttled_s(free) is None and cgroup.cpu_throttled_s(tmp_path / "gone") is None


def test_the_wrapper_never_runs_a_limited_command_outside_its_cgroup(tmp_path: Path) -> None:
    # The real launch wrapper, given a cgroup it cannot enter: with limits the command does not run.
    marker, log, status = tmp_path / "ran", tmp_path / "a.log", tmp_path / "a.status"
    env = {"PATH": os.environ["PATH"], cgroup.CGROUP_VAR: str(tmp_path / "no-such-cgroup")}
    for limited in (True, False):
        wrapper_env = {**env, cgroup.LIMITS_VAR: "1"} if limited else env
        subprocess.run(["/bin/sh", "-c", WRAPPER_SH, "supervise-wrapper", str(log), str(status), str(tmp_path),
                        "/bin/sh", "-c", f"touch {marker}"], env=wrapper_env, check=True, capture_output=True)
        wait_until(lambda: status.exists(), timeout=10)
        if limited:
            assert status.read_text().strip() == "113" and not marker.exists()
            assert "not run without its [limits]" in log.read_text()
            status.unlink()
        else:  # without limits: contained by tag and group, and run
            assert status.read_text().strip() == "0" and marker.exists()
            assert "contained by tag and group only" in log.read_text()


def test_a_cgroup_root_that_is_no_cgroup_gives_no_limits_and_says_why(tmp_path: Path) -> None:
    mounts = tmp_path / "mounts"
    mounts.write_text(f"cgroup2 {tmp_path} cgroup2 rw 0 0\n")
    found = cgroup.detect(mounts, tmp_path / "no-own", base=tmp_path / "plain")
    assert found.kind is ContainmentKind.TAG and not found.controllers
    assert found.limits_note == f"cgroup_root {tmp_path / 'plain'} is not a cgroup v2 directory: processes are found by tag and group"
