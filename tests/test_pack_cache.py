"""Validated probe packs kept on disk (``probes/_packcache``): a load of unchanged packs does not
validate them again, gives the same packs, and nothing found at the cache's path can change a
pack or make loading fail."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from supervisor.core.errors import ProbePackError
from supervisor.probes import _kept, _loading, _packcache
from supervisor.probes._pack import Pack

PACK = """name = "mine"
priority = 5
[[probes]]
id = "loss"
kind = "metric"
regex = 'loss (?P<loss>[\\d.]+)'
fields = { loss = "float" }
set = { unit = "nats", scale = 2, on = true }
"""


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private cache folder, and a fresh process's view of it at each ``fresh()``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(_loading.PACK_CACHE_ENV, raising=False)
    fresh(monkeypatch)
    return tmp_path / "cache" / "supervise" / _packcache.FILE_NAME


def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """As a new process: nothing read of the cache, no pack remembered in memory."""
    monkeypatch.setattr(_loading, "_CACHE", _packcache.PackCache())
    _loading._read_unchanged_pack.cache_clear()


def validated(monkeypatch: pytest.MonkeyPatch) -> list[Pack]:
    """The packs as validated now, the cache not used."""
    monkeypatch.setenv(_loading.PACK_CACHE_ENV, "off")
    fresh(monkeypatch)
    try:
        return _loading.load_packs(paths=[])
    finally:
        monkeypatch.delenv(_loading.PACK_CACHE_ENV)
        fresh(monkeypatch)


def no_validation(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(raw: dict[str, Any], source: str) -> Pack:
        raise AssertionError(f"{source} validated again")

    monkeypatch.setattr(_loading, "parse_pack", refuse)


def test_unchanged_packs_load_from_the_cache_without_validation(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = _loading.load_packs()
    assert cache.is_file()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o600
    assert stat.S_IMODE(cache.parent.stat().st_mode) == 0o700
    fresh(monkeypatch)
    no_validation(monkeypatch)
    again = _loading.load_packs()
    assert again == first
    assert [p.source for p in again] == [p.source for p in first]


def test_a_kept_pack_is_the_validated_pack_value_for_value(cache: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    every_pack = validated(monkeypatch)
    assert _loading.load_packs() == every_pack  # kept now
    path = tmp_path / "mine.toml"
    path.write_text(PACK)
    expected = _loading.load_packs([], [path])
    fresh(monkeypatch)
    no_validation(monkeypatch)
    assert _loading.load_packs() == every_pack
    (kept,) = _loading.load_packs([], [path])
    assert [kept] == expected
    probe = kept.probes[0]
    assert probe.constants == {"unit": "nats", "scale": 2, "on": True}
    assert type(probe.constants["scale"]) is int and type(probe.constants["on"]) is bool


def test_an_edited_pack_is_validated_again_and_a_bad_one_never_kept(cache: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(PACK)
    _loading.load_packs([], [path])
    path.write_text(PACK.replace('kind = "metric"', 'kind = "metrics"'))
    for _ in range(2):  # the second load finds no kept pack for these bytes: the same error
        fresh(monkeypatch)
        with pytest.raises(ProbePackError, match="unknown kind 'metrics'"):
            _loading.load_packs([], [path])
    path.write_text(PACK.replace("priority = 5", "priority = 7"))
    fresh(monkeypatch)
    assert _loading.load_packs([], [path])[0].priority == 7


def _entries(cache: Path) -> dict[str, Any]:
    _magic, _code, _digest, payload = cache.read_bytes().split(b"\n", 3)
    return dict(json.loads(payload))


def _write(cache: Path, entries: dict[str, Any], code: str | None = None) -> None:
    payload = json.dumps(entries).encode()
    cache.write_bytes(b"supervise-packs-1\n" + (code or _kept.code_digest()).encode() + b"\n"
                      + hashlib.sha256(payload).hexdigest().encode() + b"\n" + payload)


def test_a_corrupt_or_foreign_cache_is_ignored(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(PACK)
    expected = _loading.load_packs([], [path])
    good = cache.read_bytes()
    _entries_of_good = _entries(cache)
    (name,) = _entries(cache)
    entry = _entries(cache)[name]
    wrong_type = json.loads(json.dumps(entry))
    wrong_type["probes"][0][3] = "not-a-kind"
    wrong_shape = json.loads(json.dumps(entry))
    wrong_shape["probes"][0][7] = {"unit": ["a", "list"]}
    altered = good.replace(b'"mine"', b'"yours"')
    cases: list[tuple[str, Any]] = [
        ("garbage", b"\x00\xff" * 100), ("empty", b""), ("cut short", good[: len(good) // 2]),
        ("altered payload", altered), ("another format", b"supervise-packs-0\n" + good[18:]),
        ("an entry of the wrong type", {name: wrong_type}), ("a value of the wrong shape", {name: wrong_shape}),
        ("not an object", []), ("written by other code", "other code"), ("a link to /dev/zero", "/dev/zero"), ("a FIFO", "fifo"),
    ]
    for what, content in cases:
        cache.unlink(missing_ok=True)
        if isinstance(content, bytes):
            cache.write_bytes(content)
        elif content == "/dev/zero":
            cache.symlink_to("/dev/zero")
        elif content == "fifo":
            os.mkfifo(cache)
        elif content == "other code":
            other = json.loads(json.dumps(_entries_of_good))
            other[name]["priority"] = 99  # a valid pack, kept by other code: not read
            _write(cache, other, code="0" * 64)
        else:
            _write(cache, content)
        fresh(monkeypatch)
        assert _loading.load_packs([], [path]) == expected, what


def test_a_cache_folder_that_cannot_be_written_costs_only_the_validation(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    fresh(monkeypatch)
    assert _loading.load_packs() == validated(monkeypatch)


def test_the_cache_keeps_the_latest_packs_only(cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "mine.toml"
    for n in range(_packcache.KEEP + 5):
        path.write_text(PACK.replace("priority = 5", f"priority = {n}"))
        fresh(monkeypatch)
        _loading.load_packs([], [path])
    assert len(_entries(cache)) == _packcache.KEEP
    fresh(monkeypatch)
    no_validation(monkeypatch)
    assert _loading.load_packs([], [path])[0].priority == _packcache.KEEP + 4


def test_pack_cache_off_validates_every_pack_at_every_load(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _loading.load_packs()
    assert cache.is_file()
    validations: list[str] = []
    real = _loading.parse_pack

    def counted(raw: dict[str, Any], source: str) -> Pack:
        validations.append(source)
        return real(raw, source)

    monkeypatch.setattr(_loading, "parse_pack", counted)
    for value in ("off", "OFF ", "0", "no", "false"):
        monkeypatch.setenv(_loading.PACK_CACHE_ENV, value)
        fresh(monkeypatch)
        packs = _loading.load_packs()
        assert len(validations) == len(packs), value
        validations.clear()
    monkeypatch.setenv(_loading.PACK_CACHE_ENV, "on")  # anything else: the cache is used
    fresh(monkeypatch)
    _loading.load_packs()
    assert validations == []
