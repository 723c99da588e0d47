"""Pipelines and `after` through a real daemon: steps run in order with outputs passed forward,
a step that gives up cancels those after it, a daemon SIGKILL between steps resumes, a re-run
skips the steps done with the same inputs, bad pipelines are refused with nothing stored."""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import REPO, supervise

from supervisor.cli.client import Client
from supervisor.core import protocol
from supervisor.core.errors import SpecError
from supervisor.core.events import EventKind, JobState

# argv: out dir, input file ('' for none), gate file ('' for none), fail ('1': crash), label, runs log.
STEP = """\
import os, sys, time
from pathlib import Path
out, src, gate, fail, label, runs = sys.argv[1:7]
with open(runs, "a") as f:
    f.write(label + "\\n")
print("starting", label, flush=True)
while gate and not os.path.exists(gate):
    time.sleep(0.02)
if fail == "1":
    raise KeyError("layers.0.weight_scale")
text = Path(src).read_text() if src else ""
Path(out).mkdir(parents=True, exist_ok=True)
Path(out, "result.txt").write_text(text + label + " ")
print("done", label, flush=True)
"""

PIPELINE = """\
[pipeline]
name = "trio"
[pipeline.params]
gate = ""
fail = "0"
[[pipeline.steps]]
name = "prepare"
job = "step"
set = {{ out = "{home}/out/prepare", label = "prepare" }}
[[pipeline.steps]]
name = "work"
job = "step"
set = {{ out = "{home}/out/work", input = "{{steps.prepare.params.out}}/result.txt", label = "work", gate = "{{gate}}", fail = "{{fail}}" }}
[[pipeline.steps]]
name = "final"
job = "step"
set = {{ out = "{home}/out/final", input = "{{steps.work.params.out}}/result.txt", label = "final" }}
"""


def _step_spec(directory: Path, home: Path, name: str = "step", extra: str = "") -> Path:
    (directory / "step.py").write_text(STEP)
    spec = directory / f"{name}.toml"
    spec.write_text(textwrap.dedent(f"""\
        name = "{name}"
        command = ["{{python}}", "{{spec_dir}}/step.py", "{{out}}", "{{input}}", "{{gate}}", "{{fail}}", "{{label}}", "{{runs}}"]
        probes = ["python"]
        stop_grace_s = 2
        {extra}
        [params]
        out = "{home}/out/{name}"
        input = ""
        gate = ""
        fail = "0"
        label = "{name}"
        runs = "{home}/runs.log"
        [env]
        SUPERVISE_HOME = "{home}"
        [restart]
        max_attempts = 1
        """))
    return spec


@pytest.fixture
def trio(home: Path) -> Path:
    directory = home / "specs"
    directory.mkdir()
    _step_spec(directory, home)
    path = directory / "trio.toml"
    path.write_text(PIPELINE.format(home=home))
    return path


def _pipeline(client: Client, name: str = "trio") -> protocol.PipelineStatus:
    return client.status(name).pipelines[0]


def _ends(client: Client, state: JobState, timeout: float = 60, name: str = "trio") -> protocol.PipelineStatus:
    def ended() -> protocol.PipelineStatus | None:
        status = _pipeline(client, name)
        assert status.state not in {JobState.FAILED, JobState.CANCELLED} - {state}, status
        return status if status.state is state else None

    return wait_until(ended, timeout=timeout)  # type: ignore[return-value]


def _runs(home: Path) -> list[str]:
    return (home / "runs.log").read_text().split()


def test_three_steps_run_in_order_and_a_rerun_skips_those_done(daemon: DaemonProcess, home: Path, trio: Path,
                                                             daemon_env: dict[str, str]) -> None:
    client = daemon.client()
    started = client.start_pipeline(str(trio), {})
    assert started.started == ["prepare", "work", "final"] and started.skipped == []
    status = _ends(client, JobState.DONE)
    # Each step read what the one before it wrote, through {steps.X.params.out}.
    assert (home / "out" / "final" / "result.txt").read_text() == "prepare work final "
    assert [s.state for s in status.steps] == [JobState.DONE] * 3 and _runs(home) == ["prepare", "work", "final"]
    shown = supervise(daemon_env, "status", "trio").stdout
    assert shown.splitlines()[0].startswith("trio (pipeline): done") and "2. work" in shown

    again = supervise(daemon_env, "start", str(trio))
    assert "skipped prepare, work, final (done with the same inputs)" in again.stdout
    assert _runs(home) == ["prepare", "work", "final"]  # nothing ran again
    # Another input for the middle step: it and the step after it run again, the first is skipped.
    rerun = client.start_pipeline(str(trio), {"work.label": "work2"})
    assert rerun.skipped == ["prepare"] and rerun.started == ["work", "final"]
    _ends(client, JobState.DONE)
    assert _runs(home) == ["prepare", "work", "final", "work2", "final"]
    assert (home / "out" / "final" / "result.txt").read_text() == "prepare work2 final "
    assert [s.skipped for s in _pipeline(client).steps] == [True, False, False]


def test_status_gives_an_overall_eta_from_the_steps_history(daemon: DaemonProcess, home: Path, trio: Path,
                                                            daemon_env: dict[str, str]) -> None:
    client = daemon.client()
    first_gate, second_gate = home / "gate1", home / "gate2"
    client.start_pipeline(str(trio), {"gate": str(first_gate)})
    # A first run: the middle step has never ended done, so there is no ETA, and --json says why.
    wait_until(lambda: _pipeline(client).current == "work" and _runs(home) == ["prepare", "work"])
    status = _pipeline(client)
    assert status.eta_s is None and status.eta_note == "ETA unknown: no history for step work"
    assert "ETA" not in supervise(daemon_env, "status", "trio").stdout.splitlines()[0]
    first_gate.touch()
    _ends(client, JobState.DONE)
    assert _pipeline(client).eta_s is None and _pipeline(client).eta_note == ""  # nothing left

    # Again with another input for the middle step: it and the last run again, with history now.
    usual = {step: client.attempts(f"trio.{step}").attempts[-1] for step in ("work", "final")}
    work_s, final_s = ((a.ended or 0) - a.started for a in usual.values())
    rerun = client.start_pipeline(str(trio), {"gate": str(second_gate), "work.label": "work2"})
    assert rerun.started == ["work", "final"]
    wait_until(lambda: _runs(home)[-1] == "work2" and _pipeline(client).current == "work")
    status = _pipeline(client)
    # What is left of the middle step (its last duration less the time it has run) plus the last step.
    assert status.eta_s is not None and status.eta_note == "", status
    assert final_s - 0.01 <= status.eta_s <= work_s + final_s + 0.01, (status.eta_s, work_s, final_s)
    line = supervise(daemon_env, "status", "trio").stdout.splitlines()[0]
    assert line.startswith("trio (pipeline): running  step 2/3 work  ETA ") and " overall" in line, line
    shown = json.loads(supervise(daemon_env, "status", "trio", "--json").stdout)["pipelines"][0]
    assert shown["eta_s"] is not None and shown["eta_note"] == ""
    second_gate.touch()
    _ends(client, JobState.DONE)


def test_a_failing_middle_step_cancels_the_last_with_one_reason(daemon: DaemonProcess, home: Path, trio: Path,
                                                              daemon_env: dict[str, str]) -> None:
    client = daemon.client()
    client.start_pipeline(str(trio), {"fail": "1"})
    _ends(client, JobState.FAILED)
    status = wait_until(lambda: (p := _pipeline(client)).steps[2].state is JobState.CANCELLED and p)
    assert status.current == "work" and [s.state for s in status.steps] == [JobState.DONE, JobState.FAILED, JobState.CANCELLED]
    final = status.steps[2]
    assert final.attempt is None and _runs(home) == ["prepare", "work"]  # nothing launched
    assert final.reason.startswith("not launched: trio.work failed") and "\n" not in final.reason
    alerts = [e for e in client.events("trio.final").events if e.kind is EventKind.ALERT]
    assert len(alerts) == 1 and alerts[0].data["evidence"] == final.reason
    result = supervise(daemon_env, "status", "trio", check=False)
    assert result.returncode == 1 and "cancelled" in result.stdout


def test_a_daemon_sigkill_between_steps_resumes_the_pipeline(daemon: DaemonProcess, home: Path, trio: Path) -> None:
    gate = home / "gate"
    client = daemon.client()
    client.start_pipeline(str(trio), {"gate": str(gate)})
    wait_until(lambda: _pipeline(client).current == "work" and _runs(home) == ["prepare", "work"])
    assert _pipeline(client).steps[2].state is JobState.WAITING
    daemon.kill()  # SIGKILL: nothing is said to the store
    gate.touch()  # the middle step ends while no daemon watches it
    wait_until(lambda: (home / "out" / "work" / "result.txt").exists())
    daemon.start()
    client = daemon.client()
    status = _ends(client, JobState.DONE)
    assert [s.state for s in status.steps] == [JobState.DONE] * 3
    assert _runs(home) == ["prepare", "work", "final"]  # each step once


def test_after_holds_a_job_until_the_other_is_done(daemon: DaemonProcess, home: Path, daemon_env: dict[str, str]) -> None:
    directory = home / "specs"
    directory.mkdir()
    gate = home / "gate"
    first = _step_spec(directory, home, "first")
    second = _step_spec(directory, home, "second")
    client = daemon.client()
    client.start(str(first), {"gate": str(gate)})
    result = supervise(daemon_env, "start", str(second), "--after", "first")
    assert "second waiting: waiting for first (running)" in result.stdout
    assert client.status("second").jobs[0].state is JobState.WAITING and _runs(home) == ["first"]
    gate.touch()
    wait_until(lambda: client.status("second").jobs[0].state is JobState.DONE)
    assert _runs(home) == ["first", "second"]


def test_start_after_a_job_that_gave_up_fails_in_one_line(daemon: DaemonProcess, home: Path,
                                                         daemon_env: dict[str, str]) -> None:
    directory = home / "specs"
    directory.mkdir()
    first = _step_spec(directory, home, "first")
    second = _step_spec(directory, home, "second")
    client = daemon.client()
    client.start(str(first), {"fail": "1"})  # max_attempts = 1: it gives up
    wait_until(lambda: client.status("first").jobs[0].state is JobState.FAILED)
    result = supervise(daemon_env, "start", str(second), "--after", "first", check=False)
    assert result.returncode == 1, result
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert "second cancelled: not launched" in result.stderr and "first" in result.stderr
    assert client.status("second").jobs[0].state is JobState.CANCELLED and _runs(home) == ["first"]
    assert client.ping().pid == daemon.proc.pid


BAD_PIPELINES = {  # what is replaced in the good pipeline, by what, and what the one line says
    "unknown step reference": ("{steps.prepare.params.out}", "{steps.nope.params.out}",
                               "{steps.nope.params.out}: 'nope': no such step"),
    "reference to a later step": ("{steps.prepare.params.out}", "{steps.final.params.out}", "work does not run after it"),
    "cycle": ('name = "prepare"\n', 'name = "prepare"\nafter = ["final"]\n', "a cycle among steps prepare, work, final"),
    "unknown step in after": ('name = "final"\n', 'name = "final"\nafter = ["nope"]\n', "after: no step named 'nope'"),
    "unknown job": ('name = "final"\njob = "step"', 'name = "final"\njob = "nosuchjob"', "no nosuchjob.toml"),
}


@pytest.mark.parametrize("case", sorted(BAD_PIPELINES))
def test_bad_pipelines_are_refused_with_one_line_and_nothing_stored(daemon: DaemonProcess, home: Path, trio: Path,
                                                                    daemon_env: dict[str, str], case: str) -> None:
    old, new, message = BAD_PIPELINES[case]
    text = trio.read_text()
    assert old in text
    bad = trio.with_name("bad.toml")
    bad.write_text(text.replace(old, new, 1))
    result = supervise(daemon_env, "start", str(bad), check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1 and message in result.stderr, result.stderr
    client = daemon.client()
    with pytest.raises(SpecError, match=r"bad\.toml"):  # straight to the daemon, not through the CLI's own check
        client.start_pipeline(str(bad), {})
    status = client.status()
    assert status.pipelines == [] and status.jobs == []  # nothing stored
    assert client.ping().pid == daemon.proc.pid


def test_after_an_unknown_job_or_a_cycle_is_refused(daemon: DaemonProcess, home: Path, daemon_env: dict[str, str]) -> None:
    directory = home / "specs"
    directory.mkdir()
    gate = home / "gate"
    one = _step_spec(directory, home, "one")
    two = _step_spec(directory, home, "two", extra='after = ["one"]')
    result = supervise(daemon_env, "start", str(one), "--after", "nope", check=False)
    assert result.returncode == 65 and result.stderr.count("\n") == 1 and "no job named 'nope'" in result.stderr
    client = daemon.client()
    assert client.status().jobs == []
    client.start(str(one), {"gate": str(gate)})
    client.start(str(two), {})  # waits for one
    client.stop("one", 1)  # one gave up: two is cancelled
    wait_until(lambda: client.status("two").jobs[0].state is JobState.CANCELLED)
    result = supervise(daemon_env, "start", str(one), "--after", "two", check=False)
    assert result.returncode == 65 and "a cycle (" in result.stderr and result.stderr.count("\n") == 1
    assert client.status("one").jobs[0].state is JobState.STOPPED  # nothing stored


@pytest.mark.slow
@pytest.mark.timeout(600)  # extraction then 2 epochs of training: about 1 minute on 2 busy cores
def test_the_eagle3_pipeline_extracts_then_trains_on_the_embedded_default(daemon: DaemonProcess, home: Path,
                                                                          daemon_env: dict[str, str]) -> None:
    # docs/guides/pipelines.md's example, on the first 16 of the 64 shipped prompts: the seam under test is one
    # step's output read by the next, which a quarter of the data crosses the same way (the whole default
    # extraction runs from the wheel in tests/test_wheel.py).
    prompts = home / "prompts-16.jsonl"
    prompts.write_text("".join((REPO / "jobs" / "data" / "prompts.jsonl").read_text().splitlines(keepends=True)[:16]))
    result = supervise(daemon_env, "start", "eagle3", "--set", "train.epochs=2", "--set", f"extract.prompts={prompts}")
    assert "steps extract -> train" in result.stdout
    client = daemon.client()
    status = _ends(client, JobState.DONE, timeout=540, name="eagle3")
    assert [s.state for s in status.steps] == [JobState.DONE, JobState.DONE]
    draft = home / "out" / "eagle3" / "train"
    assert (draft / "config.json").is_file() and (draft / "model.safetensors").is_file()
    assert (home / "out" / "eagle3" / "extract" / "manifest.json").is_file()
    again = client.start_pipeline(str(REPO / "jobs" / "eagle3.toml"), {"train.epochs": "2", "extract.prompts": str(prompts)})
    assert again.skipped == ["extract", "train"]


def test_stop_of_a_pipeline_stops_its_running_step_and_what_waits(daemon: DaemonProcess, home: Path, trio: Path,
                                                                  daemon_env: dict[str, str]) -> None:
    # `status trio` reads the pipeline; `stop trio` said "no job named trio" (66).
    client = daemon.client()
    gate = home / "gate"
    client.start_pipeline(str(trio), {"gate": str(gate)})
    wait_until(lambda: _pipeline(client).current == "work" and _pipeline(client).steps[1].state is JobState.RUNNING,
               timeout=30)
    result = supervise(daemon_env, "stop", "trio", check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("stopped pipeline trio: work: 2 processes"), result.stdout
    # The step after it is cancelled (its `after` gave up), or stopped by the verb if it came first.
    states = wait_until(lambda: (got := [s.state for s in _pipeline(client).steps])[2] is not JobState.WAITING and got)
    assert states[:2] == [JobState.DONE, JobState.STOPPED] and states[2] in (JobState.CANCELLED, JobState.STOPPED), states
    gate.touch()
    time.sleep(0.5)  # nothing of it launches afterwards
    assert _runs(home) == ["prepare", "work"]
    again = supervise(daemon_env, "stop", "trio", check=False)
    assert again.returncode == 0 and "pipeline trio is not running" in again.stdout
    unknown = supervise(daemon_env, "stop", "nosuch", check=False)
    assert unknown.returncode == 66 and unknown.stderr.count("\n") == 1
