"""The Hyperscan prefilter: the same events with it as without it, its fallbacks and its bounds."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from supervisor.core.events import ProbeEvent
from supervisor.core.records import split_records
from supervisor.probes import ProbeEngine, _hsfilter, load_packs

PACKS = load_packs()
CORPUS = Path(__file__).parent / "data" / "corpus"
needs_hyperscan = pytest.mark.skipif(_hsfilter.hyperscan is None, reason="the hyperscan package is not installed")


def _engine(packs: list, on: bool, monkeypatch: pytest.MonkeyPatch) -> ProbeEngine:
    if on:
        monkeypatch.delenv("SUPERVISE_PREFILTER", raising=False)
    else:
        monkeypatch.setenv("SUPERVISE_PREFILTER", "off")
    return ProbeEngine(packs)


def _events(data: bytes, on: bool, monkeypatch: pytest.MonkeyPatch, *, packs: list | None = None,
            seed: int = 0, per_record: bool = False) -> list[ProbeEvent]:
    """Every event of ``data``, fed in random batches (or record by record)."""
    engine = _engine(PACKS if packs is None else packs, on, monkeypatch)
    records, _ = split_records(data, 0, final=True)
    rng = random.Random(seed)
    out: list[ProbeEvent] = []
    i = 0
    while i < len(records):
        n = 1 if per_record else rng.choice((1, 3, 50, 400, 5000))
        batch = records[i : i + n]
        out += engine.feed(batch[0]) if per_record else engine.feed_many(batch)
        i += n
    return out + engine.flush()


def _same_both_ways(data: bytes, monkeypatch: pytest.MonkeyPatch, **kw: object) -> int:
    on = _events(data, True, monkeypatch, **kw)  # type: ignore[arg-type]
    off = _events(data, False, monkeypatch, **kw)  # type: ignore[arg-type]
    assert on == off
    return len(on)


def _corpus_lines() -> list[bytes]:
    lines: list[bytes] = []
    for path in sorted(CORPUS.rglob("*.log")):
        lines += path.read_bytes().split(b"\n")
    return lines


_PREFIXES = [b"", b"", b"", b"(APIServer pid=1) ", b"[rank3]: ", b"\x1b[1;36m(VllmWorker TP3 pid=9)\x1b[0;0m ",
             b"vllm-1  | ", b"  ", b"\t", b"ERROR 04-19 16:21:20 [x.py:1] "]


def _mutate(rng: random.Random, line: bytes) -> bytes:
    text = line.decode("utf-8", "replace")
    choice = rng.random()
    if choice < 0.2 and text:
        cut = rng.randrange(len(text))
        text = text[:cut] + text[cut + rng.randint(1, 5):]
    elif choice < 0.3:
        text = text.swapcase()
    elif choice < 0.4 and text:
        cut = rng.randrange(len(text))
        text = text[:cut] + rng.choice(["\u212a", "\u017f", "é", "\x1b[31m", "|", "%", " ", "\r"]) + text[cut:]
    return rng.choice(_PREFIXES) + text.encode("utf-8", "replace")


@needs_hyperscan
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_corpus_lines_same_events(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    lines = _corpus_lines()
    start = rng.randrange(len(lines))
    picked = lines[start : start + 4000] + [_mutate(rng, rng.choice(lines)) for _ in range(6000)]
    rng.shuffle(picked[4000:])
    data = b"\n".join(picked) + b"\n"
    assert _same_both_ways(data, monkeypatch, seed=seed) > 0


@needs_hyperscan
def test_corpus_lines_same_events_record_by_record(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    lines = _corpus_lines()
    data = b"\n".join(_mutate(rng, rng.choice(lines)) for _ in range(3000)) + b"\n"
    assert _same_both_ways(data, monkeypatch, per_record=True) > 0


_WORDS = ["Traceback (most recent call last):", 'File "x.py", line 3, in f', "Error", "error:", "CUDA", "out of memory",
          "NCCL", "timeout", "Loading weights took", "seconds", "GiB", "%|", "| ", "/", "it/s", "[00:01<00:02,",
          "Epoch", "Training", "rank", "pid=", "KV cache", "RuntimeError", "Killed", "Segmentation fault", "step",
          "loss", "=", ":", "\u212a", "\u017f", "é", "\x1b[0m", "\t", " "]


@needs_hyperscan
@pytest.mark.parametrize("seed", [11, 12])
def test_random_lines_same_events(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    lines = []
    for _ in range(8000):
        parts = [rng.choice(_WORDS) if rng.random() < 0.6 else str(rng.randint(0, 10**rng.randint(1, 6)))
                 for _ in range(rng.randint(0, 12))]
        lines.append(rng.choice(_PREFIXES) + "".join(parts).encode())
    data = b"\n".join(lines) + b"\n"
    _same_both_ways(data, monkeypatch, seed=seed)


def test_switch_off_uses_re2(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(PACKS, False, monkeypatch)
    assert engine.reader == "re2 (prefilter off: SUPERVISE_PREFILTER=off)"


@needs_hyperscan
def test_switch_on_uses_hyperscan(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _engine(PACKS, True, monkeypatch)
    n = sum(len(p.probes) for p in PACKS)
    assert engine.reader == f"hyperscan prefilter, {n} patterns, 0 checked by RE2 alone"


def _pack(tmp_path: Path, *regexes: str) -> list:
    body = "name = 'odd'\n" + "".join(
        f"[[probes]]\nid = 'p{i}'\nkind = 'info'\nregex = '{rx}'\n" for i, rx in enumerate(regexes))
    (tmp_path / "odd.toml").write_text(body)
    return load_packs([], [tmp_path / "odd.toml"])


@needs_hyperscan
def test_refused_pattern_is_checked_by_re2_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # (?U) is RE2 syntax Hyperscan refuses; a case-insensitive non-ASCII pattern is not given to it.
    packs = _pack(tmp_path, r"(?U)widget (?P<n>\d+) broke", r"(?i)straße (?P<m>\d+)", r"^gadget (?P<k>\d+)$")
    engine = _engine(packs, True, monkeypatch)
    assert engine.reader == "hyperscan prefilter, 3 patterns, 2 checked by RE2 alone"
    data = b"x widget 12 broke\nSTRASSE 1\nSTRA\xc3\x9fE 4\nnothing\n(pid=1) gadget 7\ngadget 8\n"
    on = _events(data, True, monkeypatch, packs=packs)
    assert [(e.probe, e.fields) for e in on] == [("odd.p0", {"n": "12"}), ("odd.p1", {"m": "4"}),
                                                   ("odd.p2", {"k": "8"})]
    assert on == _events(data, False, monkeypatch, packs=packs)


@needs_hyperscan
def test_costly_patterns_fall_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pattern over the compile bounds is left to RE2; a database over them turns Hyperscan off."""
    packs = _pack(tmp_path, r"alpha (?P<n>\d+)", r"beta (?P<n>\d+)")
    _hsfilter.build.cache_clear()
    _hsfilter._too_costly.cache_clear()
    try:
        monkeypatch.setattr(_hsfilter, "MAX_DB_BYTES_ONE", 0)
        monkeypatch.setattr(_hsfilter, "MAX_DB_BYTES", 0)  # patterns are checked alone when the set is over
        assert _engine(packs, True, monkeypatch).reader == \
            "re2 (prefilter off: Hyperscan accepts none of the probe regexes)"
        _hsfilter.build.cache_clear()
        _hsfilter._too_costly.cache_clear()
        monkeypatch.undo()
        monkeypatch.setattr(_hsfilter, "MAX_DB_BYTES", 0)
        assert _engine(packs, True, monkeypatch).reader.startswith(
            "re2 (prefilter off: the Hyperscan database costs too much")
        data = b"alpha 1\nbeta 2\ngamma 3\n"
        assert [e.fields for e in _events(data, True, monkeypatch, packs=packs)] == [{"n": "1"}, {"n": "2"}]
    finally:
        _hsfilter.build.cache_clear()
        _hsfilter._too_costly.cache_clear()


@needs_hyperscan
def test_builtin_packs_compile_within_bounds() -> None:
    patterns = tuple(p.regex for pack in PACKS for p in pack.probes)
    _hsfilter.build.cache_clear()
    plan = _hsfilter.build(patterns, ())
    assert isinstance(plan, _hsfilter.Plan)
    assert plan.compile_s < _hsfilter.MAX_COMPILE_S and plan.size < _hsfilter.MAX_DB_BYTES


@needs_hyperscan
def test_a_set_within_its_bounds_compiles_once() -> None:
    """Every start compiles the packs: when the whole set is within its bounds, the patterns are
    not compiled one by one as well (that doubled the start-up compile)."""
    patterns = tuple(p.regex for pack in PACKS for p in pack.probes)
    _hsfilter.build.cache_clear()
    _hsfilter._too_costly.cache_clear()
    plan = _hsfilter.build(patterns, ("Traceback (most recent call last)",))
    assert isinstance(plan, _hsfilter.Plan) and plan.alone == ()
    assert _hsfilter._too_costly.cache_info().misses == 0


@pytest.mark.parametrize(("pattern", "form"), [
    (r"^foo (?P<n>\d+)$", r"foo (?P<n>\d)"),
    # A tail that may repeat or be absent is cut: one match end a line, not one a character.
    (r"iteration\s+(?P<done>\d+) \| samples:(?:.*?\| loss: (?P<loss>\d+))?", r"iteration\s+(?P<done>\d+) \| samples:"),
    (r"^\s*what\(\):\s+(?P<what>\S.*)", r"\s*what\(\):\s+(?P<what>\S)"),
    (r"a(b|c)d{2,5}", r"a(b|c)d{2}"),
    (r"a(bc+)*", "a"),
    (r"ab|cd*", "ab|cd*"),
    (r"x*", "x*"),
    (r"\bword\b", "word"),
    (r"[\^$]x", r"[\^$]x"),
    (r"a\$b", r"a\$b"),
    (r"(?i)straße", None),
    (r"(?si:straße)", None),
    (r"(?-i:straße)", "(?-i:straße)"),
    (r"^*x", None),
])
def test_hs_form(pattern: str, form: str | None) -> None:
    assert _hsfilter.hs_form(pattern) == form


@needs_hyperscan
def test_threads_share_the_database(monkeypatch: pytest.MonkeyPatch) -> None:
    """The daemon matches each attempt in a thread of its own; each has its own scratch space."""
    import threading

    data = b"\n".join(_corpus_lines()[:20000]) + b"\n"
    expected = _events(data, True, monkeypatch)
    records, _ = split_records(data, 0, final=True)
    results: dict[int, list[ProbeEvent]] = {}

    def read(i: int) -> None:
        engine = ProbeEngine(PACKS)
        results[i] = [e for start in range(0, len(records), 500) for e in engine.feed_many(records[start:start + 500])]
        results[i] += engine.flush()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(results[i] == expected for i in range(3))


@pytest.mark.parametrize("on", [True, False])
def test_probe_stats_names_the_engine(on: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    from supervisor.cli import main

    if on and _hsfilter.hyperscan is None:
        pytest.skip("the hyperscan package is not installed")
    log = tmp_path / "x.log"
    log.write_text("INFO 04-19 16:21:20 [loader.py:1] Loading weights took 2.40 seconds\n")
    _engine(PACKS, on, monkeypatch)  # sets the switch
    assert main(["probe", "--json", "--stats", str(log)]) == 0
    out, err = capsys.readouterr()
    assert out.lstrip().startswith("{")
    expected = "hyperscan prefilter, " if on else "re2 (prefilter off: SUPERVISE_PREFILTER=off)"
    assert f"supervise probe: read by {expected}" in err


def test_doctor_names_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    from supervisor.cli.doctor import _reader_check

    monkeypatch.setenv("SUPERVISE_PREFILTER", "off")
    check = _reader_check()
    assert (check.status, check.detail) == ("ok", "re2 (prefilter off: SUPERVISE_PREFILTER=off)")
    monkeypatch.setattr(_hsfilter, "hyperscan", None)
    monkeypatch.delenv("SUPERVISE_PREFILTER")
    check = _reader_check()
    assert check.status == "warn" and "pip install hyperscan" in check.detail


@needs_hyperscan
def test_a_flood_of_matches_reads_the_batch_with_re2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A digit run matches ``\\d`` (the prefilter's form of ``\\d+``) at every digit: past the cap,
    every record of the batch is read."""
    packs = _pack(tmp_path, r"(?P<n>\d+)")
    engine = _engine(packs, True, monkeypatch)
    assert engine._prefilter is not None
    line = "7" * 20_000
    scanner = _hsfilter.HsScanner(engine._prefilter.db, f"{line}\nnothing\n".encode(), 2)
    assert scanner.everything and scanner.first_hit(len(line) + 1) == len(line) + 1
    data = f"a\n{line}\nn 5\nnothing\n".encode()
    on = _events(data, True, monkeypatch, packs=packs)
    assert [e.fields["n"] for e in on] == ["7" * 20_000, "5"]
    assert on == _events(data, False, monkeypatch, packs=packs)


@needs_hyperscan
def test_small_batches_are_scanned_by_the_literal_scan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A daemon's batch of a few lines costs less through RE2's literal scan than through a Hyperscan
    scan call; a long batch goes to Hyperscan.  Either names the same records for the engine."""
    from supervisor.probes import _scan

    engine = _engine(PACKS, True, monkeypatch)
    prefilter = engine._prefilter
    assert prefilter is not None and prefilter.db is not None
    lines = [line.decode("utf-8", "replace") for line in _corpus_lines()[:2000]]
    assert prefilter.scanner(lines[: _scan.SMALL_BATCH])._hs is None
    assert prefilter.scanner(lines[: _scan.SMALL_BATCH + 1])._hs is not None
    for size in (1, 20, _scan.SMALL_BATCH, 500):
        named: list[list[int]] = []
        for scanner in (prefilter.scanner(lines[:size]), _scan.Scanner(prefilter, lines[:size])):
            found, i = [], 0
            while i < size and (hit := scanner.next_candidate(i)) is not None:
                found.append(hit)
                i = hit + 1
            named.append(found)
        # Both name every record a probe matches (the engine reads only those): check on the lines.
        for index, line in enumerate(lines[:size]):
            if engine._matches(line.encode("utf-8", "replace")):
                assert all(index in found for found in named), (size, line)


@needs_hyperscan
def test_the_database_is_kept_between_processes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second start loads the compiled database instead of compiling it; a kept file that is
    altered or cut short, or a cache that cannot be written, costs a compile and nothing else."""
    from supervisor.probes import _hscache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data = b"\n".join(_corpus_lines()[:3000]) + b"\n"
    expected = _events(data, False, monkeypatch)
    _hsfilter.build.cache_clear()
    reader = _engine(PACKS, True, monkeypatch).reader
    assert reader.startswith("hyperscan prefilter")
    [kept] = (tmp_path / "cache" / "supervise").glob("hs-*.db")

    def no_compile(*_a: object) -> None:
        raise AssertionError("compiled again")

    with monkeypatch.context() as m:
        m.setattr(_hsfilter, "_compile", no_compile)
        _hsfilter.build.cache_clear()
        assert _engine(PACKS, True, monkeypatch).reader == reader
        _hsfilter.build.cache_clear()
        assert _events(data, True, monkeypatch) == expected
    for damage in (lambda b: b[:-1000], lambda b: b[:-5] + bytes(x ^ 0xFF for x in b[-5:]), lambda b: b"junk"):
        kept.write_bytes(damage(kept.read_bytes()))
        assert _hscache.load(_hsfilter.hyperscan, kept.stem[3:]) is None
        _hsfilter.build.cache_clear()
        assert _engine(PACKS, True, monkeypatch).reader == reader  # compiled, and kept again
        assert _hscache.load(_hsfilter.hyperscan, kept.stem[3:]) is not None
        _hsfilter.build.cache_clear()
        assert _events(data, True, monkeypatch) == expected
    (tmp_path / "file").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "file"))
    _hsfilter.build.cache_clear()
    assert _engine(PACKS, True, monkeypatch).reader == reader
    _hsfilter.build.cache_clear()
    assert _events(data, True, monkeypatch) == expected
    _hsfilter.build.cache_clear()


@needs_hyperscan
def test_the_kept_databases_are_bounded_and_the_one_in_use_stays(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """One database per pack set: a pack edited and tried again and again must not fill the cache;
    the most recently used ones are kept."""
    import os

    from supervisor.probes import _hscache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "supervise"
    db = _hsfilter.hyperscan.Database()
    db.compile(expressions=[b"Traceback"], ids=[0], flags=[0])
    _hscache.store(_hsfilter.hyperscan, "in-use", db, 0.1)
    for n in range(3 * _hscache.KEEP):
        os.utime(folder / "hs-in-use.db", (10.0**9 + n, 10.0**9 + n))  # older than what follows...
        assert _hscache.load(_hsfilter.hyperscan, "in-use") is not None  # ...but used again now
        _hscache.store(_hsfilter.hyperscan, f"edit-{n}", db, 0.1)
    names = sorted(p.name for p in folder.glob("hs-*.db"))
    assert len(names) == _hscache.KEEP
    assert "hs-in-use.db" in names
    assert f"hs-edit-{3 * _hscache.KEEP - 1}.db" in names
    assert not list(folder.glob(".hs-*.tmp"))


def _load_in_a_child(cache_home: Path, name: str) -> str:
    """``_hscache.load`` in a child process with its memory bounded and a deadline: what it does
    with a FIFO or /dev/zero at the name, without hanging or filling this one."""
    import os
    import subprocess
    import sys

    script = ("import resource, sys\n"
              "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
              "from supervisor.probes import _hscache, _hsfilter\n"
              "try:\n"
              "    print('none' if _hscache.load(_hsfilter.hyperscan, sys.argv[1]) is None else 'loaded')\n"
              "except MemoryError:\n"
              "    print('MemoryError')\n")
    try:
        done = subprocess.run([sys.executable, "-c", script, name], capture_output=True, text=True, timeout=20,
                              env={**os.environ, "XDG_CACHE_HOME": str(cache_home)}, check=False)
    except subprocess.TimeoutExpired:
        return "hung"
    return done.stdout.strip() or done.stderr.strip()[-300:]


@needs_hyperscan
def test_what_lies_at_a_kept_database_name_is_not_trusted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A valid database of other patterns at the pack set's name, a FIFO, a link to /dev/zero:
    each costs a compile, never a wrong reading, a hang or the memory."""
    import os
    import shutil
    import time

    from supervisor.probes import _hscache

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = tmp_path / "cache" / "supervise"
    data = b"\n".join(_corpus_lines()[:3000]) + b"\n"
    expected = _events(data, False, monkeypatch)
    assert any(e.kind.value == "failure" for e in expected)
    _hsfilter.build.cache_clear()
    reader = _engine(PACKS, True, monkeypatch).reader
    [kept] = folder.glob("hs-*.db")
    name = kept.stem[3:]
    other = _hsfilter.hyperscan.Database()
    other.compile(expressions=[b"nothing the probes look for"], ids=[0], flags=[0])
    _hscache.store(_hsfilter.hyperscan, "other", other, 0.1)
    shutil.copyfile(folder / "hs-other.db", kept)  # a database the cache wrote, of other patterns
    assert _hscache.load(_hsfilter.hyperscan, name) is None
    _hsfilter.build.cache_clear()
    assert _events(data, True, monkeypatch) == expected
    for plant in ("fifo", "zero"):
        kept.unlink()
        os.mkfifo(kept) if plant == "fifo" else kept.symlink_to("/dev/zero")
        began = time.monotonic()
        assert _load_in_a_child(tmp_path / "cache", name) == "none", plant
        assert time.monotonic() - began < 15, plant
    kept.unlink()
    _hsfilter.build.cache_clear()
    assert _engine(PACKS, True, monkeypatch).reader == reader  # compiled and kept again
    assert _hscache.load(_hsfilter.hyperscan, name) is not None
    _hsfilter.build.cache_clear()


@needs_hyperscan
def test_a_linked_cache_folder_loses_none_of_its_other_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from supervisor.probes import _hscache

    elsewhere = tmp_path / "shared"
    elsewhere.mkdir()
    foreign = {"hs-notes.db": b"someone's notes", f"hs-{'a' * 40}.db": b"SQLite format 3\x00",
               "hs-1.db": b"", "hs-x.db.db": b"x" * 100, "hs-data.db": b"\x00" * 4096}
    for file_name, content in foreign.items():
        (elsewhere / file_name).write_bytes(content)
        os.utime(elsewhere / file_name, (10.0**9, 10.0**9))  # older than anything the cache writes
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "supervise").symlink_to(elsewhere)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    db = _hsfilter.hyperscan.Database()
    db.compile(expressions=[b"Traceback"], ids=[0], flags=[0])
    for n in range(2 * _hscache.KEEP):
        _hscache.store(_hsfilter.hyperscan, f"edit-{n}", db, 0.1)
    for file_name, content in foreign.items():
        assert (elsewhere / file_name).read_bytes() == content, file_name
    assert len([p for p in elsewhere.glob("hs-edit-*.db")]) == _hscache.KEEP
