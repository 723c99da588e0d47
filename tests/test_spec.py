"""Job specs: validation errors name file and field; templates never split or inject."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from supervisor.core.errors import SpecError
from supervisor.core.overrides import FieldOverrides
from supervisor.spec.model import find_spec, load_spec, parse_overrides
from supervisor.spec.pipeline import is_pipeline_file, load_pipeline, resolve

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_specs_validate() -> None:
    for path in (REPO / "jobs").glob("*.toml"):
        if is_pipeline_file(path):  # jobs/eagle3.toml: each step a job spec
            for step in resolve(load_pipeline(path), path, {}).steps:
                assert step.spec.argv(1), (path, step.step)
            continue
        spec = load_spec(path)
        assert spec.argv(1), path


def test_builtin_jobs_write_under_the_state_dir_not_beside_their_spec(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Installed from a wheel, a built-in spec lives in site-packages: output must not land there.
    monkeypatch.setenv("SUPERVISE_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # no ./jobs here: the built-in specs are found through supervisor.resources
    extract, train = find_spec("extract"), find_spec("train")
    assert Path(extract.spec_path) == REPO / "jobs" / "extract.toml"
    argv = extract.argv(1)
    assert argv[argv.index("--out") + 1] == str(tmp_path / "home" / "out" / "extract")
    assert argv[argv.index("--cache-dir") + 1] == str(tmp_path / "home" / "out" / "models")
    assert argv[argv.index("--prompts") + 1] == str(REPO / "jobs" / "data" / "prompts.jsonl")
    argv = train.argv(1)
    assert argv[argv.index("--data") + 1] == str(tmp_path / "home" / "out" / "extract")
    assert argv[argv.index("--out") + 1] == str(tmp_path / "home" / "out" / "train")
    state_dir = load_spec(write(tmp_path, 'command = ["{state_dir}"]')).argv(1)
    assert state_dir == [str(tmp_path / "home")]


@pytest.mark.parametrize("text, field", [
    ('command = "python x.py"', "command"),
    ('command = []', "command"),
    ('command = ["x"]\n[restart]\nmax_attempts = 0', "restart.max_attempts"),
    ('command = ["x"]\n[health]\nstall_k = -1', "health.stall_k"),
    ('command = ["x"]\nbogus = 1', "bogus"),
    ('command = ["x"]\n[health.phase_deadline_s]\nwarming_up = 5', "health.phase_deadline_s"),
    ('name = "bad name!"\ncommand = ["x"]', "name"),
    ('command = ["{unclosed"]', "command"),
])
def test_invalid_specs_name_file_and_field(tmp_path: Path, text: str, field: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert str(path) in message and f"'{field}" in message and "\n" not in message


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(write(tmp_path, "command = [unterminated"))
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "absent.toml")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"\xff\xfe")
    with pytest.raises(SpecError, match="not UTF-8"):
        load_spec(binary)


def test_set_value_stays_one_argv_item(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, 'command = ["run", "--out={out}", "{out}"]\n[params]\nout = "a"'))
    evil = "x; rm -rf / $(reboot) `id`"
    argv = spec.with_overrides({"out": evil}).argv(1)
    assert argv == ["run", f"--out={evil}", evil]


def test_builtins_and_missing_parameter(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, 'command = ["{python}", "{spec_dir}/x", "{job}", "{attempt}", "{p}"]\n[params]\np = "{spec_dir}/d"'))
    argv = spec.argv(3)
    assert argv[1] == f"{tmp_path.resolve()}/x" and argv[2] == "job" and argv[3] == "3" and argv[4] == f"{tmp_path.resolve()}/d"
    missing = load_spec(write(tmp_path, 'command = ["{nope}"]', name="m.toml"))
    with pytest.raises(SpecError, match="--set nope=VALUE"):
        missing.argv(1)


def test_overrides_parse_and_reject_unknown(tmp_path: Path) -> None:
    assert parse_overrides(["a=b=c", "x="]) == {"a": "b=c", "x": ""}
    with pytest.raises(SpecError, match="KEY=VALUE"):
        parse_overrides(["novalue"])
    spec = load_spec(write(tmp_path, 'command = ["x"]'))
    with pytest.raises(SpecError, match="no such parameter"):
        spec.with_overrides({"zzz": "1"})


def test_find_spec_by_name_uses_search_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, 'command = ["x"]', name="mine.toml")
    monkeypatch.setenv("SUPERVISE_JOBS_PATH", str(tmp_path))
    assert find_spec("mine").name == "mine"
    with pytest.raises(SpecError, match="no job spec"):
        find_spec("absent-job")


def spec_error(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    message = str(info.value)
    assert "\n" not in message and len(message.replace(str(path), "")) <= 300, message
    return message


@pytest.mark.parametrize("text, field", [
    ('command = ["x"]\nstop_grace_s = inf', "stop_grace_s"),  # made `stop` wait forever
    ('command = ["x"]\nstop_grace_s = nan', "stop_grace_s"),
    ('command = ["x"]\nstop_grace_s = 1e300', "stop_grace_s"),
    ('command = ["x"]\n[restart]\nbackoff_max_s = inf', "restart.backoff_max_s"),
    ('command = ["x"]\n[restart]\nbackoff_multiplier = nan', "restart.backoff_multiplier"),
    ('command = ["x"]\n[health]\nsilence_s = nan', "health.silence_s"),
    ('command = ["x"]\n[health]\nstall_k = inf', "health.stall_k"),
    ('command = ["x"]\n[health]\nlearned_min_s = nan', "health.learned_min_s"),
    ('command = ["x"]\n[health]\nlearned_min_s = -1', "health.learned_min_s"),
    ('command = ["x"]\n[health]\nlearned_min_s = 0', "health.learned_min_s"),
    ('command = ["x"]\n[health]\nlearned_min_s = "soon"', "health.learned_min_s"),
    ('command = ["x"]\n[health]\nlearned_min_s = 1e300', "health.learned_min_s"),
    ('command = ["x"]\n[health.phase_deadline_s]\nrunning = inf', "health.phase_deadline_s.running"),
    ('command = ["x"]\n[gpu]\nforeign_wait_s = inf', "gpu.foreign_wait_s"),
])
def test_durations_are_finite_and_bounded(tmp_path: Path, text: str, field: str) -> None:
    message = spec_error(write(tmp_path, text))
    assert f"field '{field}'" in message


def test_a_backoff_cap_below_the_first_wait_is_refused_not_ignored(tmp_path: Path) -> None:
    message = spec_error(write(tmp_path, 'command = ["x"]\n[restart]\nbackoff_max_s = 1'))
    assert "backoff_max_s (1s) is below backoff_initial_s (10s" in message, message
    spec = load_spec(write(tmp_path, 'command = ["x"]\n[restart]\nbackoff_max_s = 1\nbackoff_initial_s = 0.5'))
    assert spec.restart.backoff_max_s == 1


def test_name_is_checked_whole_and_pack_names_are_path_safe(tmp_path: Path) -> None:
    assert "field 'name'" in spec_error(write(tmp_path, 'name = "x\\n"\ncommand = ["x"]'))
    assert "field 'name'" in spec_error(write(tmp_path, 'name = "' + "a" * 65 + '"\ncommand = ["x"]'))
    message = spec_error(write(tmp_path, 'command = ["x"]\nprobes = ["../../etc/evil"]'))
    assert "field 'probes'" in message and "probe_files" in message


@pytest.mark.parametrize("template", ["{v:>99999999}", "{v:%}", "{v!r}", "{v!s:>3}", "-{python:x}"])
def test_templates_allow_plain_names_only(tmp_path: Path, template: str) -> None:
    # `{v:>99999999}` built a 100 MB argv item; `{v:%}` raised a traceback at launch.
    message = spec_error(write(tmp_path, f'command = ["{template}"]\n[params]\nv = "1"'))
    assert "field 'command'" in message and "without '!' or ':'" in message


def test_brace_escapes_and_format_specs_elsewhere(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, 'command = ["{{x}}", "a{{b}}{v}"]\n[params]\nv = "{python:>9}{spec_dir}"'))
    # A parameter's value is data: only a plain built-in is filled in, nothing else is formatted.
    assert spec.argv(1) == ["{x}", f"a{{b}}{{python:>9}}{tmp_path.resolve()}"]
    for where in ('workdir = "{v:>9999999}"', '[env]\nA = "{v:%}"'):
        assert "without '!' or ':'" in spec_error(write(tmp_path, f'command = ["x"]\n{where}', name="w.toml"))
    base = load_spec(write(tmp_path, 'command = ["x"]\nworkdir = "{v}"\n[params]\nv = "."', name="o.toml"))
    with pytest.raises(SpecError, match="without '!' or ':'"):
        base.with_overrides({}, FieldOverrides(workdir="{v:>99999999}"))


@pytest.mark.parametrize("text, field", [
    ('command = ["x"]\n[env]\n"A=B" = "1"', "env"),
    ('command = ["x"]\n[env]\n"A\\u0000" = "1"', "env"),
    ('command = ["x"]\n[env]\n"" = "1"', "env"),
    ('command = ["x"]\n[env]\nA = "1\\u0000"', "env"),
    ('command = ["x\\u0000y"]', "command"),
    ('command = ["x"]\n[params]\nv = "\\u0000"', "params"),
    ('command = ["x"]\npython = "/usr/bin/py\\u0000"', "python"),
])
def test_values_execve_cannot_pass_are_refused_before_launch(tmp_path: Path, text: str, field: str) -> None:
    # These raised ValueError inside launch and left the attempt `launching`.
    assert f"field '{field}" in spec_error(write(tmp_path, text))


def test_set_values_are_validated_like_the_file(tmp_path: Path) -> None:
    spec = load_spec(write(tmp_path, 'command = ["run", "{out}"]\n[params]\nout = "a"'))
    with pytest.raises(SpecError, match="NUL") as info:
        spec.with_overrides({"out": "a\0b"})
    assert "\n" not in str(info.value)
    with pytest.raises(SpecError, match="no such parameter") as info:
        spec.with_overrides({"k" * 100_000: "1"})
    assert len(str(info.value)) < 400


def test_nested_toml_is_one_line(tmp_path: Path) -> None:
    for deep in ("[" * 500 + "]" * 500, "{a = " * 500 + "1" + "}" * 500):
        message = spec_error(write(tmp_path, f'command = ["x"]\nparams = {deep}'))
        assert "nested too deeply" in message


def test_echoed_values_are_cut_to_one_short_line(tmp_path: Path) -> None:
    huge = "x\\n" * 3_000_000  # an 8 MB field of many lines gave an 8 MB error
    message = spec_error(write(tmp_path, f'command = "{huge[: 300_000]}"'))
    assert "field 'command'" in message and "…" in message
    message = spec_error(write(tmp_path, f'command = ["x"]\n[env]\n"{"K=" * 10_000}" = "1"', name="k.toml"))
    assert "…" in message


def test_special_files_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)  # opening it for reading used to wait for a writer: forever
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(_error_of, fifo)
        try:
            message = future.result(timeout=10)
        except TimeoutError:
            with open(fifo, "w"):  # a writer appears: the blocked reader gets EOF and the test can end
                pass
            raise AssertionError("reading a FIFO spec blocked") from None
    assert "not a regular file (a FIFO)" in message and str(fifo) in message
    assert "character device" in _error_of(Path("/dev/zero"))  # read until MemoryError
    assert "directory" in _error_of(tmp_path)
    big = tmp_path / "big.toml"
    big.write_text('command = ["x"]\n' + "#" * (2 << 20))
    assert "larger than" in _error_of(big)
    assert "NUL" in _error_of(Path("a\0b.toml"))


def _error_of(path: Path) -> str:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_relative_probe_files_are_the_specs_neighbours(tmp_path: Path) -> None:
    (tmp_path / "packs").mkdir()
    spec_file = tmp_path / "j.toml"
    spec_file.write_text('name = "j"\ncommand = ["true"]\nprobe_files = ["packs/mine.toml", "/abs/other.toml"]\n')
    spec = load_spec(spec_file)
    assert spec.probe_files == [str(tmp_path.resolve() / "packs" / "mine.toml"), "/abs/other.toml"]


@pytest.mark.parametrize("field", ["hang_after_failure_s", "waiting_s", "hung_s", "idle_s", "diverge_k"])
def test_a_rule_that_can_be_off_is_written_off(tmp_path: Path, field: str) -> None:
    """TOML has no null: the rules the docs say can be turned off are turned off with "off" (or false);
    anything else that is not a value stays refused in one line naming the field."""
    for off in ('"off"', '"OFF"', "false"):
        spec = load_spec(write(tmp_path, f'command = ["x"]\n[health]\n{field} = {off}'))
        assert getattr(spec.health, field) is None, off
    assert getattr(load_spec(write(tmp_path, 'command = ["x"]')).health, field) is not None
    for bad in ('"of"', '"none"', "0", "-1", '""'):
        message = spec_error(write(tmp_path, f'command = ["x"]\n[health]\n{field} = {bad}'))
        assert f"field 'health.{field}'" in message and "\n" not in message.strip(), (bad, message)
