"""Probe packs: the built-in ones, user packs, the search path, and one-line errors."""

from __future__ import annotations

import os
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import re2

from supervisor.core.errors import ProbePackError
from supervisor.core.events import Phase, ProbeKind, Record
from supervisor.probes import ProbeEngine, _limits, load_packs, probe_command
from supervisor.probes._literals import required_literals
from supervisor.probes._loading import BUILTIN_DIR, PROBE_PATH_ENV
from supervisor.probes._pack import re2_options

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


def test_a_pack_file_is_read_again_once_it_changes_and_not_before(tmp_path: Path) -> None:
    path = write_pack(tmp_path, GOOD_PROBE)
    (first,) = load_packs([], [path])
    (again,) = load_packs([], [path])
    assert again is first  # unchanged: not read or validated again (each runner loads its packs)
    path.write_text(path.read_text().replace("step (", "iter ("))
    os.utime(path, ns=(path.stat().st_mtime_ns + 10**9,) * 2)  # a later edit, whatever the clock's grain
    (edited,) = load_packs([], [path])
    assert edited.probes[0].regex.startswith("iter (")
    path.write_text("not = [toml")
    os.utime(path, ns=(path.stat().st_mtime_ns + 2 * 10**9,) * 2)
    with pytest.raises(ProbePackError, match="not valid TOML"):
        load_packs([], [path])


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


def probe_entry(regex: str, probe_id: str = "x") -> str:
    return f"[[probes]]\nid = '{probe_id}'\nkind = 'info'\nregex = '''{regex}'''\n"


@pytest.mark.parametrize(("regex", "expected"), [
    # Each of these is valid RE2 and matched at about 60 s per MB of log on the daemon's loop.
    ("a" * 100_000, "regex is 100000 characters long (limit 4096)"),
    ("".join(f"(?P<g{i}>a)" for i in range(5000)), "characters long"),
    ("".join(f"(?P<g{i}>a)" for i in range(40)), "40 named groups (limit 32)"),
    ("(.*){1,1000}$", "RE2 instructions"),
    ("(.*){1,200}$", "too costly to match (RE2 fanout bucket"),
    ("x.{0,999}y.{0,999}z", "RE2 instructions (limit 10000)"),
    ("b" * 1500, "a literal of 1500 characters (limit 1000)"),
    # 400 groups deep overflowed the literal extractor's recursion after launch.
    ("(" * 400 + "a" + ")" * 400, "nests groups 400 deep (limit 16)"),
    ("(?:" * 17 + "a" + ")" * 17, "nests groups 17 deep"),
])
def test_costly_patterns_are_refused_naming_file_and_probe(tmp_path: Path, regex: str, expected: str) -> None:
    message = pack_error(tmp_path, probe_entry(regex, "costly"))
    assert "probe 'costly': " in message and expected in message and len(message.replace(str(tmp_path), "")) <= 300


def test_costly_prefixes_and_whole_packs_are_refused(tmp_path: Path) -> None:
    assert "prefix 'p': regex nests groups" in pack_error(tmp_path, "[[prefixes]]\nid = 'p'\nregex = '" + "(" * 20 + "a" + ")" * 20 + "'\n")
    many = "".join(probe_entry(f"line {i}", f"p{i}") for i in range(301))
    assert "301 entries" in pack_error(tmp_path, many)
    heavy = "".join(probe_entry(f"x{i}.{{0,900}}y", f"p{i}") for i in range(12))  # ~8,000 instructions each
    assert "RE2 instructions in all" in pack_error(tmp_path, heavy)


def test_the_deepest_pattern_allowed_still_runs_through_the_engine(tmp_path: Path) -> None:
    regex = "(?:" * 15 + "(?P<done>\\d+) done" + ")" * 15
    path = write_pack(tmp_path, f"[[probes]]\nid = 'deep'\nkind = 'progress'\nregex = '{regex}'\n")
    (pack,) = load_packs([], [path])
    (event,) = ProbeEngine([pack]).feed(Record("12 done", 0, 8))
    assert event.probe == "mine.deep"


def test_builtin_packs_stay_well_inside_the_limits() -> None:
    # The limits must never bite a real pack: every built-in one uses at most half of each.
    for pack in load_packs():
        rules = [*pack.probes, *pack.prefixes, *pack.headers, *pack.classify]
        assert len(rules) * 2 <= _limits.MAX_ENTRIES, pack.name
        total = 0
        for rule in rules:
            compiled = re2.compile(rule.regex, re2_options())
            total += compiled.programsize
            assert len(rule.regex) * 2 <= _limits.MAX_PATTERN_CHARS, rule
            assert len(compiled.groupindex) * 2 <= _limits.MAX_NAMED_GROUPS, rule
            assert compiled.programsize * 2 <= _limits.MAX_PROGRAM_SIZE, rule
            assert _limits._top_bucket(compiled.programfanout) * 2 <= _limits.MAX_FANOUT_BUCKET, rule
            assert _limits.pattern_problem(rule.regex) is None
            assert _limits.pattern_problem("(" * 8 + rule.regex + ")" * 8) is None  # nesting: twice the deepest
        assert total * 2 <= _limits.MAX_PACK_PROGRAM_SIZE, pack.name


def test_re2_writes_nothing_of_its_own(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    # RE2's C++ log lines (and a b'...' repr in the message) used to come before the error.
    message = pack_error(tmp_path, probe_entry("foo(?=bar)") )
    message += pack_error(tmp_path, probe_entry("(unclosed"))
    assert "b'" not in message and "missing )" in message
    captured = capfd.readouterr()
    assert "re2.cc" not in captured.err and "absl" not in captured.err, captured.err


def test_special_and_huge_pack_files_are_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.toml"
    os.mkfifo(fifo)
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(_pack_load_error, fifo)
        try:
            message = future.result(timeout=10)
        except TimeoutError:
            with open(fifo, "w"):  # unblock the reader so the test can end
                pass
            raise AssertionError("reading a FIFO pack blocked") from None
    assert "not a regular file (a FIFO)" in message
    assert "character device" in _pack_load_error(Path("/dev/zero"))
    big = write_pack(tmp_path, GOOD_PROBE + "#" * (2 << 20), name="big")
    assert "larger than" in _pack_load_error(big)
    nested = write_pack(tmp_path, "x = " + "[" * 600 + "]" * 600 + "\n", name="nested")
    assert "nested too deeply" in _pack_load_error(nested)


def test_echoed_ids_and_keys_are_cut(tmp_path: Path) -> None:
    message = pack_error(tmp_path, f"[[probes]]\nid = 'x'\nkind = 'info'\nregex = 'a'\n{'k' * 50_000} = 1\n")
    assert "unknown key" in message and len(message) < 400
    message = pack_error(tmp_path, f"[[probes]]\nid = 'x'\nkind = '{'z' * 50_000}'\nregex = 'a'\n")
    assert "unknown kind" in message and len(message) < 500


def test_probe_command_refuses_a_costly_pack_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "job.log"
    log.write_text("hello\n" * 10)
    costly = write_pack(tmp_path, probe_entry("(.*){1,1000}$", "slow"))
    assert probe_command(str(log), [], [str(costly)], False) == 65
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(costly) in err and "probe 'slow'" in err and "RE2 instructions" in err


def _pack_load_error(path: Path) -> str:
    with pytest.raises(ProbePackError) as info:
        load_packs([], [path])
    assert "\n" not in str(info.value) and str(path) in str(info.value)
    return str(info.value)
