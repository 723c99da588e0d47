"""Probe packs: the built-in ones, user packs, the search path, and one-line errors."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from supervisor.errors import ProbePackError
from supervisor.events import Phase, ProbeKind, Record
from supervisor.probes import ProbeEngine, load_packs
from supervisor.probes._pack import BUILTIN_DIR, PROBE_PATH_ENV
from supervisor.probes._literals import required_literals

GOOD_PROBE = """
[[probes]]
id = "steps"
kind = "progress"
phase = "running"
regex = 'step (?P<done>\\d+)/(?P<total>\\d+)'
fields = { done = "int", total = "int" }
"""


def write_pack(tmp_path: Path, body: str, name: str = "mine") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\n' + textwrap.dedent(body))
    return path


def pack_error(tmp_path: Path, body: str) -> str:
    path = write_pack(tmp_path, body)
    with pytest.raises(ProbePackError) as info:
        load_packs([], [path])
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    return message


def test_builtin_packs_load_and_every_probe_has_a_prefilter_literal() -> None:
    packs = load_packs()
    names = {p.name for p in packs}
    assert {"vllm", "python", "cuda", "nccl", "tqdm", "transformers", "deepspeed", "extract", "train"} <= names
    assert [p.priority for p in packs] == sorted(p.priority for p in packs)
    for pack in packs:
        assert pack.source.startswith(str(BUILTIN_DIR))
        for probe in pack.probes:
            # Without one, every line of every log would be read in Python: slow.
            assert required_literals(probe.regex) is not None, probe.name
    assert not ProbeEngine(packs)._always


def test_named_packs_only(tmp_path: Path) -> None:
    packs = load_packs(["python", "vllm", "python"])
    assert [p.name for p in packs] == ["vllm", "python"]


def test_user_pack_from_a_path(tmp_path: Path) -> None:
    path = write_pack(tmp_path, GOOD_PROBE)
    (pack,) = load_packs([], [path])
    (probe,) = pack.probes
    assert (probe.name, probe.kind, probe.phase) == ("mine.steps", ProbeKind.PROGRESS, Phase.RUNNING)
    (event,) = ProbeEngine([pack]).feed(Record("epoch 1 step 3/10", 0, 18))
    assert (event.probe, event.fields["done"], event.fields["total"]) == ("mine.steps", 3, 10)


def test_search_path_packs_shadow_builtin_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    user_dir = tmp_path / "packs"
    user_dir.mkdir()
    shadow = write_pack(user_dir, GOOD_PROBE, name="vllm")
    write_pack(user_dir, GOOD_PROBE, name="extra")
    monkeypatch.setenv(PROBE_PATH_ENV, str(user_dir))
    (vllm,) = load_packs(["vllm"])
    assert vllm.source == str(shadow)
    everything = {p.name: p for p in load_packs()}
    assert everything["vllm"].source == str(shadow) and "extra" in everything and "cuda" in everything


def test_a_pack_file_replaces_the_named_pack_of_the_same_name(tmp_path: Path) -> None:
    mine = write_pack(tmp_path, GOOD_PROBE, name="cuda")
    packs = load_packs(["cuda", "nccl"], [mine])
    assert sorted((p.name, p.source) for p in packs) == [("cuda", str(mine)), ("nccl", str(BUILTIN_DIR / "nccl.toml"))]


def test_unknown_pack_name() -> None:
    with pytest.raises(ProbePackError, match="unknown probe pack 'nope'") as info:
        load_packs(["nope"])
    assert "\n" not in str(info.value)


def test_two_pack_files_with_one_name(tmp_path: Path) -> None:
    a = write_pack(tmp_path, GOOD_PROBE, name="dup")
    other = tmp_path / "other"
    other.mkdir()
    b = write_pack(other, GOOD_PROBE, name="dup")
    with pytest.raises(ProbePackError, match="pack name 'dup' is also used"):
        load_packs([], [a, b])


@pytest.mark.parametrize(("body", "expected"), [
    ("[[probes]]\nid = 'x'\nkind = 'info'\nregex = '(unclosed'\n", "probe 'x': regex does not compile with RE2"),
    ("[[probes]]\nid = 'x'\nkind = 'info'\nregex = 'foo(?=bar)'\n", "probe 'x': uses lookaround"),
    ("[[probes]]\nid = 'x'\nkind = 'info'\nregex = '(?<!no)foo'\n", "probe 'x': uses lookaround"),
    ("[[probes]]\nid = 'x'\nkind = 'info'\nregex = '(a)\\1'\n", "probe 'x': uses a backreference"),
    ("[[probes]]\nid = 'x'\nkind = 'phase'\nphase = 'loading'\nregex = 'a'\n", "probe 'x': unknown phase 'loading'"),
    ("[[probes]]\nid = 'x'\nkind = 'progres'\nregex = 'a'\n", "probe 'x': unknown kind 'progres'"),
    ("[[probes]]\nid = 'x'\nkind = 'failure'\nfailure = 'boom'\nregex = 'a'\n", "probe 'x': unknown failure 'boom'"),
    ("[[probes]]\nid = 'x'\nkind = 'failure'\nregex = 'a'\n", "probe 'x': a failure probe needs 'failure'"),
    ("[[probes]]\nid = 'x'\nkind = 'info'\nfailure = 'other'\nregex = 'a'\n", "probe 'x': 'failure' is only for"),
    ("[[probes]]\nid = 'x'\nkind = 'metric'\nregex = '(?P<secs>\\d+) s'\nfields = { gib = 'float' }\n",
     "probe 'x': field 'gib' is not a named group of the regex (groups: secs)"),
    ("[[probes]]\nid = 'x'\nkind = 'metric'\nregex = '(?P<secs>\\d+) s'\nfields = { secs = 'decimal' }\n",
     "probe 'x': field 'secs' has unknown type 'decimal'"),
    ("[[probes]]\nid = 'x'\nkind = 'progress'\nregex = '(?P<total>\\d+) items'\n",
     "probe 'x': a progress probe's regex needs a named group 'done'"),
    ("[[probes]]\nid = 'x'\nkind = 'info'\nregex = 'a'\n[[probes]]\nid = 'x'\nkind = 'info'\nregex = 'b'\n",
     "probe 'x': duplicate probe id"),
    ("[[probes]]\nid = 'x'\nkind = 'info'\n", "probe 'x': regex: missing"),
    ("[[probes]]\nid = 'x'\nkind = 'info'\nregex = 'a'\ncolour = 'red'\n", "probe 'x': colour: unknown key"),
    ("[[probes]]\nkind = 'info'\nregex = 'a'\n", "probe 1: id: missing"),
    ("[[prefixes]]\nid = 'p'\nregex = '(?P<pid>\\d+'\n", "prefix 'p': regex does not compile"),
    ("[[headers]]\nid = 'h'\nregex = '(?=x)'\n", "header 'h': uses lookaround"),
    ("[[classify]]\nfailure = 'oom'\nregex = 'x'\n", "classify rule 1 (oom): unknown failure 'oom'"),
    ("priority = 'high'\n", "priority: Input should be a valid integer"),
    ("this is = not toml =\n", "not valid TOML"),
])
def test_invalid_packs_fail_with_one_line(tmp_path: Path, body: str, expected: str) -> None:
    assert expected in pack_error(tmp_path, body)


def test_unreadable_pack_file(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ProbePackError, match="cannot read probe pack") as info:
        load_packs([], [missing])
    assert str(missing) in str(info.value) and "\n" not in str(info.value)
