"""What the probes work out from each regex, kept on disk (``probes/_kept``): a process whose
patterns were seen before parses none of them, the answers are the same, and nothing found at
the file's path can change an answer."""

from __future__ import annotations

import hashlib
import json
import stat
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.events import Record
from supervisor.probes import _engine, _hsfilter, _kept, _literals, _loading
from supervisor.probes._engine import ProbeEngine

LOG = ["INFO 05-01 10:00:00 [loader.py:12] Loading safetensors checkpoint shards: 100% 4/4 [00:03<00:00]",
       "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
       "Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "ValueError: bad", "done"]


@pytest.fixture
def kept_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    fresh(monkeypatch)
    return tmp_path / "cache" / "supervise" / "patterns.cache"


def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a new process: the file not read yet, no answer remembered in memory."""
    monkeypatch.setattr(_kept, "PATTERNS", _kept.KeptFile("patterns.cache", b"supervise-patterns-1\n", 8192))
    _literals.required_literals.cache_clear()
    _hsfilter.build.cache_clear()


def events(engine: ProbeEngine) -> list[tuple[str, int, dict[str, Any]]]:
    out = []
    offset = 0
    for line in LOG:
        out += engine.feed(Record(line, offset, offset + len(line) + 1))
        offset += len(line) + 1
    out += engine.flush()
    return [(e.probe, e.offset, e.fields) for e in out]


def no_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("a pattern parsed again")

    for module, name in ((_hsfilter, "_tokens"), (_literals, "_tokens"), (_engine, "without_optional_tail")):
        monkeypatch.setattr(module, name, refuse)


def test_a_process_after_the_first_parses_no_pattern(kept_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    packs = _loading.load_packs()
    first = ProbeEngine(packs)
    seen = events(first)
    assert stat.S_IMODE(kept_file.stat().st_mode) == 0o600
    fresh(monkeypatch)
    no_parsing(monkeypatch)
    again = ProbeEngine(packs)
    assert again.reader == first.reader
    assert events(again) == seen
    assert seen  # the log is read: a progress bar, an OOM, a traceback


def _rewrite(path: Path, change: Any, code: str | None = None) -> None:
    magic, digest_line, _payload_digest, payload = path.read_bytes().split(b"\n", 3)
    entries = change(json.loads(payload))
    data = json.dumps(entries).encode()
    path.write_bytes(magic + b"\n" + (code.encode() if code else digest_line) + b"\n"
                     + hashlib.sha256(data).hexdigest().encode() + b"\n" + data)


def test_a_corrupt_or_foreign_file_changes_no_answer(kept_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pattern = r"(?i)loss[:=] *(?P<loss>\d+\.\d+)\b"
    expected = (_hsfilter.hs_form(pattern), _literals.required_literals(pattern), _engine._bar_form(pattern))
    _kept.save_patterns()
    good = kept_file.read_bytes()

    def everything(value: Any) -> Any:
        return lambda entries: {name: value for name in entries}

    cases: list[tuple[str, Any]] = [
        ("garbage", b"\xff" * 300), ("cut short", good[: len(good) // 2]), ("altered", good.replace(b"loss", b"LOSS")),
        ("answers of the wrong type", everything([42])), ("answers not in a list", everything("x")),
        ("literals of the wrong shape", everything([[["a", "yes"]]])), ("other code", "other code"),
    ]
    for what, case in cases:
        kept_file.write_bytes(good)
        if isinstance(case, bytes):
            kept_file.write_bytes(case)
        elif case == "other code":
            _rewrite(kept_file, everything(["x"]), code="0" * 64)
        else:
            _rewrite(kept_file, case)
        fresh(monkeypatch)
        got = (_hsfilter.hs_form(pattern), _literals.required_literals(pattern), _engine._bar_form(pattern))
        assert got == expected, what


def test_a_folder_that_cannot_be_written_costs_only_the_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    fresh(monkeypatch)
    engine = ProbeEngine(_loading.load_packs())
    assert events(engine)


def test_a_probe_without_an_optional_tail_is_compiled_once(kept_file: Path) -> None:
    engine = ProbeEngine(_loading.load_packs())
    probes = engine._probes
    once = [cp for cp in probes if _engine._bar_form(cp.probe.regex) == cp.probe.regex]
    assert once and all(cp.bar_regex is cp.regex for cp in once)
    twice = [cp for cp in probes if cp not in once]
    assert twice and all(cp.bar_regex is not cp.regex for cp in twice)  # e.g. Megatron's iteration line
