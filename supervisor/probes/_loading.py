"""Finding and loading probe packs: by name along $SUPERVISE_PROBE_PATH then the built-in
directory, every pack found, or pack files given by path."""

from __future__ import annotations

import functools
import os
import stat
from collections.abc import Sequence
from pathlib import Path

from supervisor.core.errors import ProbePackError
from supervisor.core.textfile import decode_text, parse_toml, read_bytes
from supervisor.probes import _packcache
from supervisor.probes._pack import Pack, parse_pack
from supervisor.resources import probes_dir

PROBE_PATH_ENV = "SUPERVISE_PROBE_PATH"
BUILTIN_DIR = probes_dir()
PACK_CACHE_ENV = "SUPERVISE_PACK_CACHE"  # "off": every pack validated at every load
_CACHE = _packcache.PackCache()  # this process's view of the kept packs


def load_packs(names: Sequence[str] | None = None, paths: Sequence[str | os.PathLike[str]] = ()) -> list[Pack]:
    """Load probe packs: the named ones (``None``: every pack found) plus pack files.

    Named packs are looked up as ``<name>.toml`` in the directories of
    ``$SUPERVISE_PROBE_PATH`` (``os.pathsep``-separated), then in the built-in ``probes/``
    directory; the first hit wins.  ``paths`` are pack files loaded as given; a pack file
    whose ``name`` equals a named pack replaces it.  The result is sorted by priority.
    """
    try:
        explicit = [load_pack_file(Path(p)) for p in paths]
        overridden = {pack.name for pack in explicit}
        dirs = search_dirs()
        if names is None:
            found = _all_packs(dirs)
        else:
            found = [_find_pack(name, dirs) for name in dict.fromkeys(names) if name not in overridden]
    finally:
        _CACHE.save()  # the packs validated here, in one write (also when a later one failed)
    packs = [p for p in found if p.name not in overridden] + explicit
    _check_unique(packs)
    return sorted(packs, key=lambda p: (p.priority, p.name))


def search_dirs() -> list[Path]:
    extra = os.environ.get(PROBE_PATH_ENV, "")
    dirs = [Path(d) for d in extra.split(os.pathsep) if d]
    return [*dirs, BUILTIN_DIR]


def _all_packs(dirs: list[Path]) -> list[Pack]:
    by_name: dict[str, Pack] = {}
    for directory in dirs:
        for path in sorted(directory.glob("*.toml")) if directory.is_dir() else []:
            pack = load_pack_file(path)
            by_name.setdefault(pack.name, pack)  # an earlier directory shadows a later one
    return list(by_name.values())


def _find_pack(name: str, dirs: list[Path]) -> Pack:
    for directory in dirs:
        candidate = directory / f"{name}.toml"
        if candidate.is_file():
            pack = load_pack_file(candidate)
            if pack.name != name:
                raise ProbePackError(f"{candidate}: pack file declares name '{pack.name}', expected '{name}'")
            return pack
    searched = ", ".join(str(d) for d in dirs)
    raise ProbePackError(f"unknown probe pack '{name}' (searched {searched})")


def _check_unique(packs: list[Pack]) -> None:
    seen: dict[str, str] = {}
    for pack in packs:
        if pack.name in seen:
            raise ProbePackError(f"{pack.source}: pack name '{pack.name}' is also used by {seen[pack.name]}")
        seen[pack.name] = pack.source


def load_pack_file(path: Path) -> Pack:
    """Read and validate one pack file; a file unchanged since it was last read is not read again
    (every job's runner loads its packs, on the loop, after `start` validated them).  A pack
    validated here is kept on disk by the next ``load_packs``."""
    try:
        st = path.stat()
    except OSError:
        st = None
    if st is None or not stat.S_ISREG(st.st_mode):
        return _read_pack(path)  # the reading says what is wrong, in its own words
    return _read_unchanged_pack(str(path), st.st_ino, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=256)
def _read_unchanged_pack(path: str, inode: int, size: int, mtime_ns: int) -> Pack:
    return _read_pack(Path(path))


def _read_pack(path: Path) -> Pack:
    """The pack at ``path``: kept from an earlier validation of the same bytes at the same path
    (``_packcache``), else validated here and kept."""
    data = read_bytes(path, "probe pack", ProbePackError)
    source = str(path)
    if os.environ.get(PACK_CACHE_ENV, "").strip().lower() in ("off", "0", "no", "false"):
        return _parse(data, path)
    name = _packcache.key(source, data)
    pack = _CACHE.get(name)
    if pack is None:
        pack = _parse(data, path)
        _CACHE.put(name, pack)
    return pack


def _parse(data: bytes, path: Path) -> Pack:
    text = decode_text(data, path, "probe pack", ProbePackError)
    return parse_pack(parse_toml(text, path, "probe pack", ProbePackError), str(path))
