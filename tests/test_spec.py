"""Job specs: validation errors name file and field; templates never split or inject."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.errors import SpecError
from supervisor.spec import find_spec, load_spec, parse_overrides

REPO = Path(__file__).resolve().parents[1]


def write(tmp_path: Path, text: str, name: str = "job.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_specs_validate() -> None:
    for path in (REPO / "jobs").glob("*.toml"):
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
