"""Xid errors from the kernel log, where NVML's event set cannot report them: the driver's
`NVRM: Xid (PCI:…): N, …` lines placed on the GPU at that PCI address, read from /dev/kmsg
without blocking (only what is logged after the reader opened it), and from a remote box's
dmesg with a cursor (only lines after the last one seen)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from conftest import wait_until
from fakes.fake_nvml import FakeNvml
from test_observe_e2e import FakeGpuDaemon

from supervisor.gpu.health import FaultKind
from supervisor.gpu.kernel_xids import KMSG, KernelXid, KmsgReader, XidCursor, parse_xid, pci_key, to_events
from supervisor.gpu.nvml import NvmlSampler, new_faults

# Xid lines as drivers 470-580 print them (NVIDIA's Xid catalogue and field reports).
FALLEN = "NVRM: Xid (PCI:0000:3b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
DBE = ("NVRM: Xid (PCI:0000:b3:00): 48, pid=2156, name=python, An uncorrectable double bit error (DBE) has been "
       "detected on GPU in the framebuffer at partition 0, subpartition 0.")
CONTAINED = "NVRM: Xid (PCI:0001:1a:00.0): 94, pid=88, name=python3, Ch 00000008, errorString CTX SWITCH TIMEOUT"


def test_xid_lines_give_the_pci_address_and_the_code_and_nothing_else_does() -> None:
    assert parse_xid(FALLEN) == KernelXid((0, 0x3B, 0), 79)
    assert parse_xid(DBE) == KernelXid((0, 0xB3, 0), 48)
    assert parse_xid(CONTAINED) == KernelXid((1, 0x1A, 0), 94)
    assert parse_xid(f"[ 8123.004211] {FALLEN}") == KernelXid((0, 0x3B, 0), 79, 8123.004211)
    assert parse_xid(f"[  511.250001] gpu-box kernel: {DBE}").at == 511.250001  # journalctl -o short-monotonic
    for other in ("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04",
                  "NVRM: Xid (PCI:zz:3b:00): 79", "NVRM: Xid happened", "nvidia-modeset: Xid (PCI:0000:3b:00): 79"):
        assert parse_xid(other) is None, other


def test_pci_addresses_as_nvml_and_nvidia_smi_write_them_map_to_the_gpu_index() -> None:
    assert pci_key("00000000:3B:00.0") == pci_key("0000:3b:00") == (0, 0x3B, 0)
    assert pci_key("") is None and pci_key("[N/A]") is None and pci_key("00000000:zz:00.0") is None
    events = to_events([parse_xid(FALLEN), parse_xid(DBE)], {0: "00000000:18:00.0", 1: "00000000:3B:00.0"})
    assert [(e.gpu, e.code) for e in events] == [(1, 79), (-1, 48)]  # -1: a board the sample does not show


def test_the_cursor_reports_only_lines_after_the_last_one_seen() -> None:
    cursor = XidCursor()
    old = [KernelXid((0, 0x3B, 0), 79, 10.0)]
    assert cursor.new(old) == []  # the first reading only sets the mark
    assert cursor.new(old) == []
    fresh = KernelXid((0, 0x3B, 0), 48, 20.5)
    assert cursor.new([*old, fresh]) == [fresh]
    assert cursor.new([*old, fresh]) == []
    rebooted = KernelXid((0, 0x3B, 0), 79, 3.0)  # kernel time started again
    assert cursor.new([rebooted]) == [rebooted]


def _kmsg_record(seq: int, message: str) -> str:
    # /dev/kmsg's record format: "PRIO,SEQ,USEC,FLAGS;message" then dictionary lines starting with a space.
    return f"3,{seq},{seq * 1000},-;{message}\n SUBSYSTEM=pci\n DEVICE=+pci:0000:3b:00.0\n"


def test_a_kernel_log_reader_sees_only_what_is_logged_after_it_opened(tmp_path: Path) -> None:
    # A plain file in /dev/kmsg's record format stands in for the kernel's device (named a fake:
    # writing to the real one would put false Xids in this machine's kernel log).
    fake_kmsg = tmp_path / "kmsg"
    fake_kmsg.write_text(_kmsg_record(1, FALLEN))
    reader = KmsgReader(str(fake_kmsg))
    assert reader.read_new() == [] and reader.note == ""  # logged before: not news
    with fake_kmsg.open("a") as log:
        log.write(_kmsg_record(2, "usb 1-1: new high-speed USB device"))
        log.write(_kmsg_record(3, DBE)[:40])  # a record cut mid-way: read when it is whole
    assert reader.read_new() == []
    with fake_kmsg.open("a") as log:
        log.write(_kmsg_record(3, DBE)[40:])
    assert [x.code for x in reader.read_new()] == [48]
    reader.close()


def test_an_unreadable_kernel_log_says_why_and_gives_nothing(tmp_path: Path) -> None:
    reader = KmsgReader(str(tmp_path / "no-such-log"))
    assert reader.read_new() == [] and "not readable" in reader.note and "no-such-log" in reader.note
    for bad in ("/dev/null\x00x", "", str(tmp_path)):  # a bad `kernel_log` setting: a NUL, nothing, a directory
        reader = KmsgReader(bad)
        assert reader.read_new() == [] and reader.read_new() == []
        assert reader.note, bad


@pytest.mark.skipif(not os.access(KMSG, os.R_OK), reason="this machine's kernel log is not readable")
def test_the_real_kernel_log_is_read_without_blocking_and_shows_no_xid_here() -> None:
    reader = KmsgReader()
    for _ in range(3):
        assert reader.read_new() == []  # no GPU here: no Xid; and a read with nothing new returns at once
    assert reader.note == "" or "not readable" in reader.note  # a container may refuse /dev/kmsg's open
    reader.close()


def test_where_nvml_cannot_report_xids_the_kernel_log_places_them_on_their_gpu(tmp_path: Path) -> None:
    nvml = FakeNvml()
    nvml.events_supported = False  # as in a container: nvmlEventSetCreate is refused
    for _ in range(2):
        nvml.add_device()
    fake_kmsg = tmp_path / "kmsg"
    fake_kmsg.write_text("")
    sampler = NvmlSampler(nvml=nvml, kernel_log=KmsgReader(str(fake_kmsg)))
    before = sampler.sample()
    assert before.devices[1].pci_bus_id == "00000000:28:00.0"
    with fake_kmsg.open("a") as log:
        log.write(_kmsg_record(7, "NVRM: Xid (PCI:0000:28:00): 79, pid='<unknown>', name=<unknown>, "
                                  "GPU has fallen off the bus."))
    after = sampler.sample()
    faults = new_faults(before, after)
    assert [(f.gpu, f.kind, f.xid) for f in faults] == [(1, FaultKind.XID, 79)]
    assert "fallen off the bus" in faults[0].detail
    assert new_faults(after, sampler.sample()) == []


def test_where_nvml_reports_xids_the_kernel_log_is_not_read_twice_over(tmp_path: Path) -> None:
    nvml = FakeNvml()
    nvml.add_device()
    fake_kmsg = tmp_path / "kmsg"
    fake_kmsg.write_text("")
    sampler = NvmlSampler(nvml=nvml, kernel_log=KmsgReader(str(fake_kmsg)))
    before = sampler.sample()
    nvml.inject_xid(0, 79)  # the driver reports it to NVML's event set ...
    with fake_kmsg.open("a") as log:  # ... and writes it to the kernel log
        log.write(_kmsg_record(9, "NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus."))
    assert [(f.gpu, f.xid) for f in new_faults(before, sampler.sample())] == [(0, 79)]  # once


def test_a_flood_of_one_xid_is_one_folded_event_per_sample(tmp_path: Path) -> None:
    nvml = FakeNvml()
    nvml.events_supported = False
    nvml.add_device()
    nvml.add_device()
    fake_kmsg = tmp_path / "kmsg"  # a plain file in /dev/kmsg's format (named a fake, as above)
    fake_kmsg.write_text("")
    sampler = NvmlSampler(nvml=nvml, kernel_log=KmsgReader(str(fake_kmsg)))
    before = sampler.sample()
    flood = "NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics Exception"
    with fake_kmsg.open("a") as log:
        log.writelines(_kmsg_record(seq, flood) for seq in range(100_000))
        log.write(_kmsg_record(100_001, "NVRM: Xid (PCI:0000:28:00): 79, pid='<unknown>', name=<unknown>, x"))
    after = sampler.sample()
    assert [(x.gpu, x.code, x.repeats) for x in after.xids] == [(0, 13, 100_000), (1, 79, 1)]
    faults = new_faults(before, after)
    assert [f.detail for f in faults] == ["Xid 13: graphics engine exception (often an illegal memory access in "
                                          "the job's kernel) (100,000 times since the last sample)",
                                          "Xid 79: GPU has fallen off the bus (hardware or power fault: the node needs "
                                          "attention)"]
    many = "".join(_kmsg_record(200_000 + code, f"NVRM: Xid (PCI:0000:18:00): {code}, x") for code in range(1, 100))
    with fake_kmsg.open("a") as log:
        log.write(many)
    assert len(sampler.sample().xids) == 32  # distinct codes are capped per sample, as NVML's events are


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_an_xid_flood_in_the_kernel_log_is_a_few_events_and_the_daemon_answers_throughout(
        home: Path, daemon_env: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A real daemon (NVML faked: tests/fakes/gpu_daemon.py, its event set refused as in a
    container) reads Xids from a kernel log file; a job holds GPU 0; the driver floods the log."""
    fake_kmsg = tmp_path / "kmsg"
    fake_kmsg.write_text("")
    holders = home / "holders"
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = FakeGpuDaemon(home, {**daemon_env, "SUPERVISE_FAKE_GPU_HOLDERS": str(holders),
                                  "SUPERVISE_GPU_INTERVAL_S": "0.2", "SUPERVISE_FAKE_GPU_XID_EVENTS": "0",
                                  "SUPERVISE_KERNEL_LOG": str(fake_kmsg)})
    daemon.start()
    try:
        job = tmp_path / "holder.py"
        job.write_text("import os, time\n"
                       f"open('{holders}/' + str(os.getpid()), 'w').write('0 1000\\n')\n"
                       "print('working', flush=True)\ntime.sleep(120)\n")
        spec = tmp_path / "flood.toml"
        spec.write_text(f'name = "flood"\ncommand = ["{sys.executable}", "{job}"]\nstop_grace_s = 1\n')
        client = daemon.client()
        client.start(str(spec), {})
        wait_until(lambda: any(p.name.isdigit() for p in holders.iterdir()))
        time.sleep(1.0)  # listed on GPU 0 by the next samples
        flood = "NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics Exception"
        with fake_kmsg.open("a") as log:
            log.writelines(_kmsg_record(seq, flood) for seq in range(100_000))
        slowest = 0.0
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            began = time.monotonic()
            client.ping()
            slowest = max(slowest, time.monotonic() - began)
            time.sleep(0.1)
        faults = [e for e in client.events("flood", kinds=["gpu_fault"]).events]
        assert 1 <= len(faults) <= 3, (len(faults), faults[:3])
        told = sum(int(e.message.split("(")[-1].split(" times")[0].replace(",", "")) if "times since" in e.message
                   else 1 for e in faults)
        assert told == 100_000, [e.message for e in faults]
        assert slowest < 1.0, slowest
        client.stop("flood", grace_s=1.0)
    finally:
        daemon.close()
