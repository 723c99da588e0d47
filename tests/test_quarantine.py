"""The quarantine's rules on a real SQLite store: which GPU faults quarantine a GPU (the board's,
not the job's kernel), a host after N killed/unreachable verdicts in a row (any other end starts
the count again), expiry, `--clear` by HOST or HOST:GPU (an SSH URL's port is not a GPU), a store
opened again keeps them; and a spec's `host` beside a pool is refused in one line."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from supervisor.core.errors import SpecError
from supervisor.core.events import Verdict
from supervisor.gpu.health import FaultKind, GpuFault
from supervisor.jobs.quarantine import UNREACHABLE, QuarantineRules, Quarantines, quarantines_gpu, resolve_place
from supervisor.spec.model import load_spec
from supervisor.store.database import Store
from supervisor.store.quarantine import Quarantine


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("fault,quarantined", [
    (GpuFault(1, FaultKind.XID, "Xid 79", 79), True), (GpuFault(1, FaultKind.XID, "Xid 48", 48), True),
    (GpuFault(1, FaultKind.XID, "Xid 94", 94), True), (GpuFault(1, FaultKind.ECC_UNCORRECTED, "2 new"), True),
    (GpuFault(1, FaultKind.REMAP_FAILED, "remap"), True), (GpuFault(1, FaultKind.PAGES_PENDING, "pending"), True),
    # the job's own kernel (an illegal address) and a slowdown: another GPU would not help
    (GpuFault(1, FaultKind.XID, "Xid 13", 13), False), (GpuFault(1, FaultKind.XID, "Xid 31", 31), False),
    (GpuFault(1, FaultKind.THROTTLED, "thermal"), False),
])
def test_only_a_fault_of_the_board_quarantines_the_gpu(fault: GpuFault, quarantined: bool) -> None:
    assert quarantines_gpu(fault) is quarantined


def test_a_gpu_fault_quarantines_until_expiry_and_a_reopened_store_keeps_it(tmp_path: Path) -> None:
    clock = Clock()
    q = Quarantines(Store(tmp_path / "s.db"), QuarantineRules(gpu_s=3600), clock)
    entry = asyncio.run(q.gpu_fault("local", GpuFault(1, FaultKind.XID, "Xid 79: fallen off the bus", 79)))
    assert entry is not None and (entry.place, entry.until - entry.since) == ("local:1", 3600)
    assert set(q.gpus("local")) == {1} and q.host("local") is None and q.gpus("ssh://box") == {}
    reopened = Quarantines(Store(tmp_path / "s.db"), QuarantineRules(), clock)  # a daemon restart
    assert [x.place for x in reopened.active()] == ["local:1"]
    clock.now += 3600  # expired: used again
    assert reopened.active() == [] and q.gpus("local") == {}


def test_a_host_is_quarantined_after_n_host_verdicts_in_a_row_and_any_other_end_starts_again(tmp_path: Path) -> None:
    q = Quarantines(Store(tmp_path / "s.db"), QuarantineRules(host_s=900, host_after=2), Clock())

    async def ends(*verdicts: Verdict | str) -> list[Quarantine | None]:
        return [await q.attempt_ended("ssh://box", v) for v in verdicts]

    assert asyncio.run(ends(Verdict.KILLED, Verdict.CRASHED, Verdict.KILLED)) == [None, None, None]
    assert q.host("ssh://box") is None
    *_, entry = asyncio.run(ends(UNREACHABLE))
    assert entry is not None and entry.reason == "the last 2 attempts there ended killed or unreachable"
    assert q.host("ssh://box") == entry and entry.until - entry.since == 900


def test_off_when_the_length_is_zero(tmp_path: Path) -> None:
    q = Quarantines(Store(tmp_path / "s.db"), QuarantineRules(gpu_s=0, host_s=0, host_after=1), Clock())
    assert asyncio.run(q.gpu_fault("local", GpuFault(0, FaultKind.XID, "Xid 79", 79))) is None
    assert asyncio.run(q.attempt_ended("local", Verdict.KILLED)) is None and q.active() == []


def test_clear_names_a_host_or_a_gpu_and_an_ssh_port_is_not_a_gpu(tmp_path: Path) -> None:
    q = Quarantines(Store(tmp_path / "s.db"), QuarantineRules(host_after=1), Clock())
    asyncio.run(q.gpu_fault("local", GpuFault(1, FaultKind.XID, "Xid 79", 79)))
    asyncio.run(q.gpu_fault("ssh://box:2222", GpuFault(3, FaultKind.XID, "Xid 48", 48)))
    asyncio.run(q.attempt_ended("ssh://box:2222", Verdict.KILLED))
    held = q.active()
    assert resolve_place("local:1", held) == ("local", 1) and resolve_place("local:2", held) is None
    assert resolve_place("ssh://box:2222", held) == ("ssh://box:2222", None)
    assert resolve_place("ssh://box:2222:3", held) == ("ssh://box:2222", 3)
    assert resolve_place("ssh://box", held) is None
    assert asyncio.run(q.clear("ssh://box:2222", None)) == 2  # the host's and its GPU's
    assert [x.place for x in q.active()] == ["local:1"]
    assert [x.place for x in Quarantines(Store(tmp_path / "s.db"), QuarantineRules(), Clock()).active()] == ["local:1"]


def test_host_beside_a_pool_is_refused_and_beside_shards_is_the_gather_host(tmp_path: Path) -> None:
    spec = tmp_path / "s.toml"
    common = 'python = "/usr/bin/python3"\nworkdir = "/w"\ncommand = ["true"]\n'
    spec.write_text('name = "p"\nhost = "ssh://c"\nhosts = ["ssh://a", "ssh://b"]\n' + common)
    with pytest.raises(SpecError, match=r"`host` \('ssh://c'\) and `hosts` both set: with one shard `hosts` is a "
                                        r"pool the job runs on") as info:
        load_spec(spec)
    assert "\n" not in str(info.value)
    spec.write_text('name = "p"\nhost = "ssh://c"\nhosts = ["ssh://a", "ssh://b"]\nshards = 2\n' + common)
    assert load_spec(spec).host == "ssh://c"  # a sharded job's gather runs there, as before
