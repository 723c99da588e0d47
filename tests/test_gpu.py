"""GPU sampling through NVML (a fake one here, and the real library on a GPU-less box), the
local host and the host registry sampling through it, and waiting for an attempt's memory
to be released."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pynvml
import pytest
from fakes.fake_nvml import FakeNvml

from supervisor.core.config import DaemonSettings
from supervisor.core.errors import SpecError
from supervisor.gpu.nvml import (
    GpuProcess,
    GpuSample,
    NvmlSampler,
    ReleaseResult,
    baseline_of,
    describe_memory,
    foreign_processes,
    wait_for_release,
)
from supervisor.hosts.local.host import LocalHost
from supervisor.hosts.registry import Hosts, connect
from supervisor.hosts.ssh.host import SshHost
from supervisor.store.database import Store


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    async def sleep(self, seconds: float) -> None:
        self.t += seconds


def two_gpus(clock: Clock) -> FakeNvml:
    nvml = FakeNvml(clock=clock)
    nvml.add_device(total_mib=143771, reserved_mib=4, util_pct=37)
    nvml.add_device(total_mib=143771, reserved_mib=4, util_supported=False)
    return nvml


# ---- sampling ---------------------------------------------------------------------------


def test_sample_reads_devices_and_processes() -> None:
    clock = Clock()
    nvml = two_gpus(clock)
    nvml.start_process(804, gpu=0, mib=29640)
    nvml.start_process(805, gpu=1, mib=1000, memory_reported=False)
    sampler = NvmlSampler(nvml=nvml, clock=lambda: 123.0)
    s = sampler.sample()
    assert s.available and s.reason == "" and s.ts == 123.0
    d0, d1 = s.devices
    assert (d0.index, d0.name, d0.used_mib, d0.total_mib, d0.util_pct) == (0, "NVIDIA H200", 29644, 143771, 37)
    assert d0.uuid.startswith("GPU-")
    assert d1.util_pct is None  # unsupported utilisation is not an error
    assert d1.used_mib == 1004
    assert s.processes == (GpuProcess(804, 0, 29640), GpuProcess(805, 1, None))
    sampler.close()
    assert nvml.refcount == 0


def test_sampler_initialises_once_and_again_after_a_shutdown_elsewhere() -> None:
    nvml = two_gpus(Clock())
    sampler = NvmlSampler(nvml=nvml)
    assert sampler.sample().available and sampler.sample().available
    assert nvml.calls.count("nvmlInit") == 1
    nvml.refcount = 0  # NVML shut down under us
    broken = sampler.sample()
    assert not broken.available and "Uninitialized" in broken.reason
    assert sampler.sample().available
    assert nvml.calls.count("nvmlInit") == 2


def test_no_library_is_unavailable_with_a_reason() -> None:
    nvml = FakeNvml()
    nvml.init_error = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    s = NvmlSampler(nvml=nvml).sample()
    assert not s.available
    assert s.reason.startswith("NVML unavailable: NVML Shared Library Not Found")
    assert s.devices == () and s.processes == ()


def test_no_driver_is_unavailable_with_a_reason() -> None:
    nvml = FakeNvml()
    nvml.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    s = NvmlSampler(nvml=nvml).sample()
    assert not s.available and "Driver Not Loaded" in s.reason


def test_real_pynvml_on_this_machine_never_raises() -> None:
    sampler = NvmlSampler()
    s = sampler.sample()
    sampler.close()
    if s.available:  # on a GPU machine: a real reading
        assert s.devices and all(d.total_mib > 0 for d in s.devices)
    else:
        assert s.reason.startswith("NVML unavailable: ")
        assert len(s.reason) > len("NVML unavailable: ")


def test_fake_raises_like_the_real_library() -> None:
    nvml = two_gpus(Clock())
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetUtilizationRates(nvml.nvmlDeviceGetHandleByIndex(1))
    memory = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(0))
    assert memory.used == 4 * 1024 * 1024 and memory.used + memory.free == memory.total


def test_foreign_processes_and_helpers() -> None:
    nvml = two_gpus(Clock())
    nvml.start_process(100, gpu=0, mib=500)
    nvml.start_process(200, gpu=0, mib=700)
    nvml.start_process(300, gpu=1, mib=900)
    s = NvmlSampler(nvml=nvml).sample()
    assert foreign_processes(s, None, {100}) == [GpuProcess(200, 0, 700), GpuProcess(300, 1, 900)]
    assert foreign_processes(s, [0], {100}) == [GpuProcess(200, 0, 700)]
    assert baseline_of(s, [1]) == {1: 904}
    assert describe_memory(s) == "GPU 0: 1204/143771 MiB, GPU 1: 904/143771 MiB"
    off = GpuSample(0.0, False, "NVML unavailable: x", (), ())
    assert describe_memory(off) == "NVML unavailable: x"
    assert foreign_processes(off, None, set()) == []


# ---- waiting for release ------------------------------------------------------------------


def wait(nvml: FakeNvml, clock: Clock, pids: set[int], baseline: dict[int, int], *,
         devices: list[int] | None = None, tolerance_mib: int = 512, timeout_s: float = 10.0) -> ReleaseResult:
    sampler = NvmlSampler(nvml=nvml, clock=clock)

    async def sample() -> GpuSample:
        return sampler.sample()

    return asyncio.run(wait_for_release(
        sample, devices, baseline, lambda: pids, tolerance_mib=tolerance_mib, timeout_s=timeout_s,
        interval_s=0.25, clock=clock, sleep=clock.sleep,
    ))


def test_released_when_the_process_exits_and_memory_drops() -> None:
    clock = Clock()
    nvml = two_gpus(clock)
    nvml.start_process(804, gpu=0, mib=29640)
    nvml.exit_process(804, after_s=1.0, free_lag_s=0.3)
    r = wait(nvml, clock, {804}, {0: 4, 1: 4})
    assert r.released
    assert 1.3 <= r.waited_s <= 1.3 + 0.25
    assert r.leftovers == () and r.others == ()
    assert [(m.index, m.used_mib, m.baseline_mib) for m in r.devices] == [(0, 4, 4), (1, 4, 4)]
    assert r.reason.startswith("GPU memory released after")


def test_not_released_while_memory_outlives_the_process_list() -> None:
    clock = Clock()
    nvml = two_gpus(clock)
    nvml.start_process(804, gpu=0, mib=8192)
    nvml.exit_process(804, after_s=0.0, free_lag_s=2.0)  # gone from the list, memory still used
    r = wait(nvml, clock, {804}, {0: 4})
    assert r.released and r.waited_s >= 2.0


def test_timeout_names_the_leftovers() -> None:
    clock = Clock()
    nvml = two_gpus(clock)
    nvml.start_process(804, gpu=0, mib=29640)  # the orphaned EngineCore
    nvml.start_process(999, gpu=0, mib=100)  # someone else's
    r = wait(nvml, clock, {678, 804}, {0: 4, 1: 4}, timeout_s=5.0)
    assert not r.released
    assert r.waited_s == pytest.approx(5.0)
    assert r.leftovers == (GpuProcess(804, 0, 29640),)
    assert r.others == (GpuProcess(999, 0, 100),)
    assert r.devices[0].excess_mib == 29740
    assert r.reason.startswith("GPU memory not released within 5s: pid 804 holds 29640 MiB on GPU 0")
    assert "GPU 0 uses 29744 MiB (baseline 4 + tolerance 512)" in r.reason


def test_tolerance_is_respected() -> None:
    clock = Clock()
    nvml = two_gpus(clock)
    nvml.start_process(42, gpu=0, mib=400)  # a foreign process that started meanwhile
    assert wait(nvml, clock, {804}, {0: 4}, tolerance_mib=512).released
    nvml.set_memory(42, 600)
    r = wait(nvml, clock, {804}, {0: 4}, tolerance_mib=512, timeout_s=1.0)
    assert not r.released and r.leftovers == () and r.others == (GpuProcess(42, 0, 600),)


def test_never_released_while_an_attempt_pid_holds_memory_even_within_tolerance() -> None:
    clock = Clock()
    nvml = two_gpus(clock)
    nvml.start_process(804, gpu=1, mib=10)
    r = wait(nvml, clock, {804}, {0: 4, 1: 4}, tolerance_mib=512, timeout_s=2.0)
    assert not r.released and r.leftovers == (GpuProcess(804, 1, 10),)


def test_attempt_pids_are_asked_every_round() -> None:
    # Pid 900 belongs to the attempt but is only found from the third round on (say, a
    # worker re-parented to init).  It holds little memory, within tolerance, so judging
    # with the first round's (empty) pid set would report "released" once 901 is gone.
    clock = Clock()
    nvml = two_gpus(clock)
    nvml.start_process(900, gpu=0, mib=10)
    nvml.start_process(901, gpu=0, mib=4096)
    nvml.exit_process(901, after_s=0.6)
    sampler = NvmlSampler(nvml=nvml, clock=clock)
    rounds: list[float] = []

    async def sample() -> GpuSample:
        return sampler.sample()

    def pids() -> set[int]:
        rounds.append(clock.t)
        return {900} if len(rounds) >= 3 else set()

    r = asyncio.run(wait_for_release(sample, [0], {0: 4}, pids, tolerance_mib=512, timeout_s=3.0,
                                     interval_s=0.25, clock=clock, sleep=clock.sleep))
    assert len(rounds) > 3
    assert not r.released and r.leftovers == (GpuProcess(900, 0, 10),)


def test_only_the_chosen_devices_count() -> None:
    clock = Clock()
    nvml = two_gpus(clock)
    nvml.start_process(804, gpu=1, mib=20000)
    assert wait(nvml, clock, {804}, {0: 4}, devices=[0]).released


def test_unavailable_nvml_is_never_reported_released() -> None:
    clock = Clock()
    nvml = FakeNvml(clock=clock)
    nvml.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    r = wait(nvml, clock, {804}, {0: 4}, timeout_s=1.0)
    assert not r.released
    assert r.reason.startswith("cannot confirm release: NVML unavailable: Driver Not Loaded")
    assert r.waited_s == pytest.approx(1.0)


def test_wait_with_real_asyncio_sleep_is_prompt() -> None:
    # The default clock and sleep, with a short real interval: release in the second round.
    nvml = two_gpus(Clock())
    nvml.start_process(804, gpu=0, mib=100)
    sampler = NvmlSampler(nvml=nvml)
    rounds = 0

    async def sample() -> GpuSample:
        nonlocal rounds
        rounds += 1
        if rounds == 2:
            nvml.processes.clear()
        return sampler.sample()

    r = asyncio.run(wait_for_release(sample, None, {0: 4, 1: 4}, lambda: {804}, tolerance_mib=0,
                                     timeout_s=5.0, interval_s=0.01))
    assert r.released and rounds == 2 and r.waited_s < 1.0


# ---- GPU sampling through the host protocol ---------------------------------------------


class ThreadNoting(FakeNvml):
    """Notes which thread reads the devices: NVML calls block, so never the event loop's."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: set[int] = set()

    def nvmlDeviceGetCount(self) -> int:
        self.threads.add(threading.get_ident())
        return super().nvmlDeviceGetCount()


def test_local_host_samples_nvml_off_the_event_loop_and_close_shuts_it_down(tmp_path: Path) -> None:
    nvml = ThreadNoting()
    nvml.add_device(total_mib=1000, reserved_mib=4)
    nvml.start_process(804, gpu=0, mib=100)
    host = LocalHost(tmp_path, nvml=nvml)

    async def main() -> tuple[GpuSample, int]:
        sample = await host.sample_gpus()
        await host.close()
        return sample, threading.get_ident()

    sample, loop_thread = asyncio.run(main())
    assert sample.available and sample.processes == (GpuProcess(804, 0, 100),)
    assert nvml.threads and loop_thread not in nvml.threads
    assert nvml.refcount == 0 and nvml.calls[-1] == "nvmlShutdown"


def test_registry_samples_every_host_through_the_host_and_closes_them(tmp_path: Path) -> None:
    nvml = two_gpus(Clock())
    settings = DaemonSettings(gpu_interval_s=0.01, gpu_store_every_s=0.0)
    store = Store(tmp_path / "state.db")

    async def main() -> GpuSample:
        hosts = Hosts(store, settings, LocalHost(tmp_path, nvml=nvml))
        try:
            slot = hosts.get("local")
            while slot.gpu.latest is None:  # the monitor task started by get() samples at once
                await asyncio.sleep(0.01)
            return slot.gpu.latest
        finally:
            await hosts.close()

    try:
        sample = asyncio.run(main())
    finally:
        store.close()
    assert sample.available and len(sample.devices) == 2
    assert nvml.refcount == 0  # Hosts.close() closed the local host, and with it NVML


def test_connect_maps_a_host_url_scheme_to_its_module() -> None:
    host = connect("ssh://alice@box.example:2222")  # made, not connected: nothing is dialled yet
    assert isinstance(host, SshHost) and host.target.user == "alice" and host.target.port == 2222
    for name in ("k8s://cluster", "box.example", "local2"):
        with pytest.raises(SpecError, match=f"unknown host '{name}': use 'local', 'ssh://.*', 'slurm:' or 'slurm\\+ssh://.*'"):
            connect(name)
    with pytest.raises(SpecError, match="a Slurm host is written 'slurm:'"):
        connect("slurm://cluster")
