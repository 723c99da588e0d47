"""The Slurm host's pure parts: how Slurm's answers read, how its states map onto verdicts,
the [slurm] spec table, and the policy for a preemption."""

from __future__ import annotations

import pytest

from supervisor.core.errors import SpecError
from supervisor.core.events import Verdict
from supervisor.hosts.base import ExitStatus, SchedulerEnd
from supervisor.hosts.registry import connect
from supervisor.hosts.slurm.jobs import parse_sacct, parse_scontrol
from supervisor.jobs.policy import RestartPolicy
from supervisor.jobs.runner._watching import scheduler_judgement
from supervisor.spec.model import JobSpec, RestartSpec

_LINE = ("JobId=7 JobName=t.1.abc UserId=root(0) JobState={state} Reason={reason} Dependency=(null) "
         "Requeue=1 Restarts={restarts} BatchFlag=1 ExitCode={code} NodeList={nodes} TRES=cpu=1,node=1,gres/gpu=2 "
         "Command=(null) WorkDir=/tmp/a b StdOut=/x.log")


def _info(state: str = "RUNNING", reason: str = "None", restarts: int = 0, code: str = "0:0", nodes: str = "n1"):
    info = parse_scontrol("7", _LINE.format(state=state, reason=reason, restarts=restarts, code=code, nodes=nodes))
    assert info is not None
    return info


def test_pending_reads_as_queued_with_its_reason() -> None:
    info = _info("PENDING", "Resources", nodes="(null)")
    assert info.queued and info.active and not info.ended
    assert info.reason == "Resources" and info.nodes == ""


@pytest.mark.parametrize(("state", "restarts", "end"), [
    ("COMPLETED", 0, None), ("FAILED", 0, None), ("CANCELLED", 0, None),
    ("TIMEOUT", 0, SchedulerEnd.TIMEOUT), ("OUT_OF_MEMORY", 0, SchedulerEnd.OUT_OF_MEMORY),
    ("PREEMPTED", 0, SchedulerEnd.PREEMPTED), ("NODE_FAIL", 0, SchedulerEnd.PREEMPTED),
    ("PENDING", 1, SchedulerEnd.PREEMPTED),  # requeued: Slurm would run it again; ours is a new attempt
])
def test_slurm_end_states_map_onto_ours(state: str, restarts: int, end: SchedulerEnd | None) -> None:
    info = _info(state, restarts=restarts)
    assert info.ended and info.scheduler_end is end


def test_exit_code_and_signal_are_read() -> None:
    assert _info("FAILED", code="3:0").exit_status() == ExitStatus(3, None)
    killed = _info("CANCELLED", code="0:9").exit_status()
    assert killed.signal == 9 and killed.returncode == 137
    assert _info().has_gpus


def test_sacct_line_is_read_when_the_controller_forgot_the_job() -> None:
    info = parse_sacct("7", "TIMEOUT|0:15|n1|cpu=1,node=1\n")
    assert info is not None and info.scheduler_end is SchedulerEnd.TIMEOUT and info.exit_signal == 15


@pytest.mark.parametrize(("end", "verdict"), [(SchedulerEnd.PREEMPTED, Verdict.PREEMPTED),
                                              (SchedulerEnd.TIMEOUT, Verdict.TIMEOUT),
                                              (SchedulerEnd.OUT_OF_MEMORY, Verdict.OOM)])
def test_the_schedulers_word_is_the_verdict(end: SchedulerEnd, verdict: Verdict) -> None:
    judgement = scheduler_judgement(ExitStatus(143, 15, scheduler_end=end))
    assert judgement is not None and judgement.verdict is verdict
    assert judgement.reason.startswith(f"ended by the scheduler ({end.value}); killed by signal 15")
    assert scheduler_judgement(ExitStatus(1, None)) is None


def test_a_preemption_is_relaunched_at_once_even_past_the_budget() -> None:
    policy = RestartPolicy(RestartSpec(max_attempts=1, on=[Verdict.CRASHED]))
    decision = policy.decide(Verdict.PREEMPTED, 1, None, None)
    assert decision.action == "relaunch" and decision.wait_s == 0.0
    assert policy.decide(Verdict.TIMEOUT, 1, None, None).action == "give_up"  # only where restart.on says


def _spec(**slurm: object) -> JobSpec:
    return JobSpec.model_validate({"name": "j", "host": "slurm:", "python": "/usr/bin/python3", "workdir": "/tmp",
                                   "command": ["x"], "slurm": slurm})


def test_slurm_table_becomes_sbatch_arguments() -> None:
    spec = _spec(partition="gpu", account="lab", time="1-00:00:00", nodes=2, gpus="h200:8",
                 extra=["--qos=high", "--exclusive"])
    assert spec.slurm.sbatch_args() == ("--partition=gpu", "--account=lab", "--time=1-00:00:00", "--gpus=h200:8",
                                        "--nodes=2", "--qos=high", "--exclusive")


@pytest.mark.parametrize("bad", [{"extra": ["--output=/tmp/x"]}, {"extra": ["-J", "x"]}, {"time": "soon"},
                                 {"partition": "a b"}, {"nodes": 0}])
def test_bad_slurm_table_is_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        _spec(**bad)


def test_slurm_host_addresses() -> None:
    assert connect("slurm:").name == "slurm:"
    assert str(connect("slurm:?log_root=/shared/logs").files.root) == "/shared/logs"  # type: ignore[attr-defined]
    with pytest.raises(SpecError, match="'slurm:'"):
        connect("slurm:login-node")
