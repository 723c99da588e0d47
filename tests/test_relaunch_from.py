"""Where a relaunch starts from, in parts: `[restart.adjust]`'s arithmetic and its bad values, the
checkpoints a glob finds (natural order, completeness marker) on this machine and through the
shell script an SSH host runs, and which one an attempt is given after others failed to load."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from supervisor.core.errors import SpecError, SuperviseError
from supervisor.core.events import AttemptState, Verdict
from supervisor.hosts.local.host import LocalHost
from supervisor.jobs import checkpoints
from supervisor.jobs.adjust import params_after
from supervisor.jobs.checkpoints import Checkpoint, Listing
from supervisor.spec.adjust import AdjustRule
from supervisor.spec.model import JobSpec, load_spec
from supervisor.store.database import AttemptRow

pytest_plugins = ["sshd"]  # the session-scoped sshd_server fixture (a real OpenSSH server on loopback)


def _rule(**table: object) -> AdjustRule:
    return AdjustRule.model_validate(table)


@pytest.mark.parametrize("change, before, after", [
    ("x0.5", "64", "32"), ("x0.5", "33", "16"), ("*2", "8", "16"), ("-4", "16", "12"), ("+4", "16", "20"),
    ("24", "64", "24"), ("x0.5", "0.001", "0.0005"), ("-0.5", "2.5", "2.0"), ("3", "0.1", "3.0"),
])
def test_a_change_keeps_integers_integers(change: str, before: str, after: str) -> None:
    assert _rule(p=change).apply({"p": before}) == {"p": after}


def test_changes_are_bounded_and_cumulative() -> None:
    rule = _rule(batch_size="x0.5", min="8")
    params = {"batch_size": "64", "other": "x"}
    seen = []
    for _ in range(4):
        params = rule.apply(params)
        seen.append(params["batch_size"])
    assert seen == ["32", "16", "8", "8"] and params["other"] == "x"
    assert _rule(workers="+3", max=10).apply({"workers": "8"}) == {"workers": "10"}
    assert _rule(lr="x0.1", min=1e-4).apply({"lr": "0.0005"}) == {"lr": "0.0001"}


def test_the_rule_reads_back_as_the_spec_wrote_it() -> None:
    spec = JobSpec.model_validate({"name": "j", "command": ["x", "{batch_size}"], "params": {"batch_size": "64"},
                                   "restart": {"adjust": {"oom": {"batch_size": "x0.5", "min": "8"}}}})
    dumped = spec.model_dump(mode="json")
    assert dumped["restart"]["adjust"] == {"oom": {"batch_size": "x0.5", "min": 8.0}}
    assert JobSpec.model_validate(dumped) == spec  # a stored spec is read back the same


def test_params_after_a_verdict_start_from_the_failed_attempts_own() -> None:
    spec = JobSpec.model_validate({"name": "j", "command": ["x", "{batch_size}"], "params": {"batch_size": "64"},
                                   "restart": {"adjust": {"oom": {"batch_size": "x0.5"}}}})
    first = _row(params=None)
    assert params_after(spec, first, Verdict.OOM) == {"batch_size": "32"}
    assert params_after(spec, _row(params={"batch_size": "32"}), Verdict.OOM) == {"batch_size": "16"}
    assert params_after(spec, _row(params={"batch_size": "32"}), Verdict.CRASHED) == {"batch_size": "32"}
    assert params_after(spec, first, Verdict.CRASHED) is None  # the spec's own, unchanged


def _spec_text(tmp_path: Path, top: str = "", restart: str = "", params: str = 'batch_size = "64"') -> Path:
    path = tmp_path / "job.toml"
    path.write_text(f'command = ["x", "{{batch_size}}"]\n{top}\n[params]\n{params}\n[restart]\n{restart}\n')
    return path


@pytest.mark.parametrize("top, restart, words", [
    ("", 'adjust.oom = { bs = "x0.5" }', ["restart.adjust.oom", "'bs' is not in [params]", "batch_size"]),
    ("", 'adjust.oom = { batch_size = "half" }', ["restart.adjust.oom", "'half'", '"x0.5" (multiply)']),
    ("", 'adjust.oom = { batch_size = "x0" }', ["restart.adjust.oom", "above 0"]),
    ("", 'adjust.oom = { batch_size = "x-1" }', ["restart.adjust.oom", "'x-1'"]),
    ("", 'adjust.oom = { batch_size = "+0.5" }', ["restart.adjust.oom", "integer 64 a fraction"]),
    ("", 'adjust.oom = { batch_size = "x0.5", min = "eight" }', ["restart.adjust.oom", "min must be a number"]),
    ("", 'adjust.oom = { batch_size = "x0.5", min = 9, max = 8 }', ["restart.adjust.oom", "min 9 is above max 8"]),
    ("", 'adjust.oom = { min = 8 }', ["restart.adjust.oom", "names no parameter"]),
    ("", 'adjust.oom = { batch_size = true }', ["restart.adjust.oom", "'batch_size'"]),
    ("", 'adjust.oom = "x0.5"', ["restart.adjust.oom", "a table such as"]),
    ("", 'adjust.out_of_memory = { batch_size = "x0.5" }', ["restart.adjust.out_of_memory", "'oom'"]),
    ("", 'adjust.done = { batch_size = "x0.5" }', ["adjust.done", "not relaunched on", "restart.on"]),
    ("", 'on = ["crashed"]\nadjust.oom = { batch_size = "x0.5" }', ["adjust.oom", "not relaunched on"]),
    ('checkpoint_complete = "COMPLETE"', "", ["checkpoint_complete", "needs `checkpoints`"]),
    ('checkpoints = "x/*"\ncheckpoint_complete = "a/COMPLETE"', "", ["checkpoint_complete", "without '/'"]),
    ('checkpoints = "x/*"\ncheckpoint_complete = ".."', "", ["checkpoint_complete", "file name"]),
    ('checkpoints = "{out/*"', "", ["checkpoints", "bad template"]),
    ('checkpoints = 3', "", ["checkpoints", "string"]),
])
def test_bad_values_are_one_line_naming_the_field(tmp_path: Path, top: str, restart: str, words: list[str]) -> None:
    path = _spec_text(tmp_path, top, restart)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message, message
    assert all(w in message for w in words), message


def test_a_set_value_the_rule_cannot_change_is_refused(tmp_path: Path) -> None:
    spec = load_spec(_spec_text(tmp_path, restart='adjust.oom = { batch_size = "x0.5" }'))
    with pytest.raises(SpecError, match=r"batch_size.*must be a number"):
        spec.with_overrides({"batch_size": "big"})


def test_checkpoints_in_the_order_of_the_numbers_in_their_names_then_mtime() -> None:
    found = [Checkpoint("/o/step_10", 1.0), Checkpoint("/o/step_9", 5.0), Checkpoint("/o/step_9b", 0.0),
             Checkpoint("/o/final", 0.0), Checkpoint("/o/step_2/", 9.0), Checkpoint("/o/step_2", 3.0)]
    ordered = [c.path for c in sorted(found, key=Checkpoint.order)]
    assert ordered == ["/o/final", "/o/step_2", "/o/step_2/", "/o/step_9b", "/o/step_9", "/o/step_10"]
    epochs = [Checkpoint("/o/epoch_3_step_5", 0.0), Checkpoint("/o/epoch_2_step_100", 9.0)]
    assert [c.path for c in sorted(epochs, key=Checkpoint.order)] == ["/o/epoch_2_step_100", "/o/epoch_3_step_5"]


def _tree(root: Path) -> None:
    for name, complete in (("step_1", True), ("step_2", True), ("step_10", True), ("step_11", False),
                           ("with space 3", True)):
        (root / name).mkdir(parents=True)
        if complete:
            (root / name / "COMPLETE").write_text("")
    (root / "notes.txt").write_text("")


def test_the_local_host_lists_complete_checkpoints_relative_to_the_workdir(tmp_path: Path) -> None:
    _tree(tmp_path / "out")
    spec = JobSpec.model_validate({"name": "j", "command": ["x"], "checkpoints": "{out}/*_*",
                                   "checkpoint_complete": "COMPLETE", "params": {"out": "out"},
                                   "spec_path": str(tmp_path / "j.toml")})
    listing = asyncio.run(checkpoints.list_complete(LocalHost(tmp_path / "logs"), spec))
    assert [os.path.basename(c.path) for c in listing.complete] == ["step_1", "step_2", "step_10"]
    unmarked = spec.model_copy(update={"checkpoint_complete": ""})
    listing = asyncio.run(checkpoints.list_complete(LocalHost(tmp_path / "logs"), unmarked))
    assert [os.path.basename(c.path) for c in listing.complete] == ["step_1", "step_2", "step_10", "step_11"]


class ShellOnThisMachine:
    """A faithful stand-in for the SSH host's resident shell (its transport only): the same script
    and arguments, run by sh here."""

    async def run_op(self, body: str, *args: str) -> tuple[int | None, bytes, bytes]:
        proc = await asyncio.create_subprocess_exec("sh", "-c", body, "sh", *args, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        return proc.returncode, out, err


def test_the_remote_listing_script_globs_without_splitting_and_checks_the_marker(tmp_path: Path) -> None:
    root = tmp_path / "o u t"  # a space in the directory: the glob is expanded, never split
    _tree(root)
    found = asyncio.run(checkpoints._listed(ShellOnThisMachine(), f"{root}/*", "COMPLETE"))
    assert sorted(os.path.basename(c.path) for c in found) == ["step_1", "step_10", "step_2", "with space 3"]
    assert all(c.mtime > 0 for c in found)
    assert asyncio.run(checkpoints._listed(ShellOnThisMachine(), f"{root}/none_*", "")) == []
    everything = asyncio.run(checkpoints._listed(ShellOnThisMachine(), f"{root}/step_*", ""))
    assert len(everything) == 4  # step_11 counts without a marker to ask for


def _row(n: int = 1, checkpoint: str | None = None, verdict: Verdict | None = Verdict.CRASHED,
         progressed: bool = False, params: dict[str, str] | None = None) -> AttemptRow:
    from supervisor.core.progress import BarProgress

    progress = BarProgress.from_json({"probe": "tqdm", "done": 1, "total": 3}) if progressed else None
    return AttemptRow(job="j", n=n, tag="t", host="local", argv=[], workdir="/", log_path="", status_path="",
                      pid=None, pgid=None, start_time=None, started=0.0, ended=1.0, state=AttemptState.ENDED,
                      exit_code=1, exit_signal=None, log_offset=0, phase=None, progress=progress, verdict=verdict,
                      reason=None, failure=None, fingerprint=None, action=None, checkpoint=checkpoint, params=params)


def test_a_checkpoint_is_passed_over_only_when_its_attempt_failed_before_progress() -> None:
    listing = Listing([Checkpoint("/c/1", 0), Checkpoint("/c/2", 0), Checkpoint("/c/3", 0)])
    rows = [_row(1, "/c/3"), _row(2, "/c/2", progressed=True), _row(3, "/c/1", verdict=Verdict.PREEMPTED),
            _row(4, None)]
    bad = checkpoints.failed_to_load(rows)
    assert bad == {"/c/3"}
    assert checkpoints.choose(listing, bad) == "/c/2"
    assert checkpoints.choose(listing, {"/c/1", "/c/2", "/c/3"}) == ""
    assert checkpoints.choose(Listing([]), set()) == ""


class _Unanswering:
    """A host whose shell does not answer (the SSH host's error, raised as it raises it)."""

    name = "ssh://gpu-box"

    async def run_op(self, body: str, *args: str) -> tuple[int | None, bytes, bytes]:
        from supervisor.core.errors import HostError

        raise HostError("ssh://gpu-box: connection lost")


def test_a_listing_that_fails_says_where_and_what() -> None:
    spec = JobSpec.model_validate({"name": "j", "command": ["x"], "checkpoints": "/ckpt/step_*", "python": "python3",
                                   "workdir": "/w", "host": "ssh://gpu-box"})
    with pytest.raises(SuperviseError) as info:
        asyncio.run(checkpoints.list_complete(_Unanswering(), spec))  # type: ignore[arg-type]
    assert str(info.value) == "ssh://gpu-box: the checkpoints /ckpt/step_* could not be listed: ssh://gpu-box: connection lost"


def test_an_ssh_host_lists_them_on_the_box(sshd_server, home: Path, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.hosts.ssh.host import SshHost

    fake_home = tmp_path / "home"
    fake_home.mkdir()
    monkeypatch.setenv("HOME", str(fake_home))  # ~/.ssh is never read
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    monkeypatch.setenv("SUPERVISE_HOME", str(home))  # a short state directory ({state_dir}), not under HOME
    env = sshd_server.env()
    env["SUPERVISE_SSH_LOG_ROOT"] = str(tmp_path / "remote-logs")
    _tree(tmp_path / "o u t")
    spec = JobSpec.model_validate({"name": "j", "command": ["x"], "checkpoints": "o u t/step_*",
                                   "checkpoint_complete": "COMPLETE", "python": "python3", "workdir": str(tmp_path),
                                   "host": sshd_server.url})
    host = SshHost(sshd_server.url, env=env)

    async def go() -> Listing:
        try:
            return await checkpoints.list_complete(host, spec)
        finally:
            await host.close()

    listing = asyncio.run(go())
    assert [c.path for c in listing.complete] == [str(tmp_path / "o u t" / n) for n in ("step_1", "step_2", "step_10")]
    assert checkpoints.choose(listing, set()) == str(tmp_path / "o u t" / "step_10")


def test_a_glob_under_the_home_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _tree(tmp_path / "out")
    monkeypatch.setenv("HOME", str(tmp_path))  # the shell's $HOME: here this machine's, on an SSH host the box's
    found = asyncio.run(checkpoints._listed(checkpoints._ThisMachine(), "~/out/step_1*", "COMPLETE"))
    assert sorted(c.path for c in found) == [str(tmp_path / "out" / "step_1"), str(tmp_path / "out" / "step_10")]
