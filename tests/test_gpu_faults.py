"""GPU faults from NVML (a faithful fake at the boundary): Xid events, volatile uncorrected ECC
errors, pages pending a reset, failed remaps and hardware slowdowns become `gpu_fault` events and
alerts on the attempts whose processes use that GPU, and a metric each; a healthy idle board
reports none."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
from conftest import wait_until
from fakes.fake_nvml import FakeNvml
from test_gpu_gating import ProcessBoundNvml, in_process_daemon

from supervisor.gpu.health import THROTTLE_HW_THERMAL, FaultKind
from supervisor.gpu.nvml import NvmlSampler, new_faults


def sampler(devices: int = 2) -> tuple[NvmlSampler, FakeNvml]:
    nvml = FakeNvml()
    for _ in range(devices):
        nvml.add_device()
    return NvmlSampler(nvml=nvml), nvml


def test_a_healthy_idle_board_shows_no_fault_sample_after_sample() -> None:
    s, _ = sampler()
    first = s.sample()
    assert first.available and first.devices[0].health is not None
    assert first.devices[0].health.ecc_uncorrected == 0 and first.devices[0].health.pages_pending is False
    assert new_faults(None, first) == [] and new_faults(first, s.sample()) == []


@pytest.mark.parametrize("code,words", [(79, "fallen off the bus"), (48, "double-bit ECC"), (94, "contained ECC"),
                                        (13, "graphics engine exception"), (999, "NVIDIA Xid catalogue")])
def test_an_xid_is_reported_once_with_its_gpu_and_meaning(code: int, words: str) -> None:
    s, nvml = sampler()
    before = s.sample()
    nvml.inject_xid(1, code)
    after = s.sample()
    faults = new_faults(before, after)
    assert [(f.gpu, f.kind, f.xid) for f in faults] == [(1, FaultKind.XID, code)]
    assert f"Xid {code}: " in faults[0].detail and words in faults[0].detail and faults[0].serious
    assert new_faults(after, s.sample()) == []  # drained: not said again


def test_ecc_pending_pages_failed_remaps_and_slowdowns_are_new_faults_only_when_they_change() -> None:
    s, nvml = sampler()
    before = s.sample()
    nvml.devices[0].ecc_uncorrected = 2
    nvml.devices[0].remapped = (0, 1, 1, 0)
    nvml.devices[1].throttle_reasons = 0x1 | THROTTLE_HW_THERMAL
    nvml.devices[1].remapped = (0, 0, 0, 1)
    after = s.sample()
    found = {(f.gpu, f.kind) for f in new_faults(before, after)}
    assert found == {(0, FaultKind.ECC_UNCORRECTED), (0, FaultKind.PAGES_PENDING), (1, FaultKind.THROTTLED),
                     (1, FaultKind.REMAP_FAILED)}
    assert new_faults(after, s.sample()) == []  # the same state is no new fault
    nvml.devices[0].ecc_uncorrected = 3
    assert [f.detail for f in new_faults(after, s.sample())] == [
        "1 new volatile uncorrected ECC error(s) (3 since the driver loaded)"]


def test_a_board_that_supports_none_of_it_reports_nothing_and_still_samples_memory() -> None:
    s, nvml = sampler(1)
    nvml.devices[0].health_supported = False
    sample = s.sample()
    assert sample.available and sample.devices[0].used_mib > 0
    assert sample.devices[0].health is not None and sample.devices[0].health.ecc_uncorrected is None
    assert new_faults(None, sample) == []


def test_an_xid_on_the_gpu_a_job_uses_is_an_event_an_alert_and_a_metric_others_are_not_told(tmp_path: Path) -> None:
    holders = tmp_path / "holders"
    holders.mkdir()
    script = tmp_path / "gpu_job.py"
    script.write_text("import os, time\n"
                      f"open('{holders}/' + str(os.getpid()) + '.pid', 'w').write(str(os.getpid()))\n"
                      "print('working', flush=True)\ntime.sleep(60)\n")
    other = tmp_path / "cpu_job.py"
    other.write_text("import time\nprint('no GPU here', flush=True)\ntime.sleep(60)\n")
    nvml = ProcessBoundNvml(holders)  # the job's process holds memory on GPU 0
    with in_process_daemon(nvml) as client:
        for name, path in (("gpu", script), ("cpu", other)):
            spec = tmp_path / f"{name}.toml"
            spec.write_text(f'name = "{name}"\ncommand = ["{sys.executable}", "{path}"]\nstop_grace_s = 1\n')
            client.start(str(spec), {})
        wait_until(lambda: any(p.pid for p in nvml.processes))
        time.sleep(0.3)
        nvml.inject_xid(0, 79)
        wait_until(lambda: [e for e in client.events("gpu").events if e.kind == "gpu_fault"], timeout=20)
        fault = next(e for e in client.events("gpu").events if e.kind == "gpu_fault")
        assert fault.message == "GPU 0: Xid 79: GPU has fallen off the bus (hardware or power fault: the node needs attention)"
        assert fault.data["xid"] == 79 and fault.data["kind"] == "xid"
        assert not [e for e in client.events("cpu").events if e.kind == "gpu_fault"]
        metrics = client._http.get("/metrics").text
        assert 'supervise_gpu_faults_total{gpu="0",host="local",kind="xid",xid="79"} 1.0' in metrics
        assert client.status("gpu").jobs[0].state == "running"  # warned about; the job is judged as usual
        client.stop("gpu", grace_s=1.0)
        client.stop("cpu", grace_s=1.0)


@pytest.mark.parametrize("util,idle", [(0, True), (60, False)])
def test_a_job_holding_a_gpu_at_zero_utilisation_with_no_progress_is_idle_warned_not_killed(
        tmp_path: Path, util: int, idle: bool) -> None:
    holders = tmp_path / "holders"
    holders.mkdir()
    script = tmp_path / "gpu_job.py"
    script.write_text("import os, time\n"
                      f"open('{holders}/' + str(os.getpid()) + '.pid', 'w').write(str(os.getpid()))\n"
                      "print('***** Running training *****', flush=True)\ntime.sleep(60)\n")
    nvml = ProcessBoundNvml(holders)
    nvml.devices[0].util_pct = util
    spec = tmp_path / "idle.toml"
    spec.write_text(f'name = "idle"\ncommand = ["{sys.executable}", "{script}"]\nprobes = ["transformers"]\n'
                    "stop_grace_s = 1\n[health]\nidle_s = 1.5\n")
    with in_process_daemon(nvml) as client:
        client.start(str(spec), {})
        wait_until(lambda: any(p.pid for p in nvml.processes))
        if idle:
            wait_until(lambda: [e for e in client.events("idle").events if e.kind == "verdict"], timeout=20)
            verdict = next(e for e in client.events("idle").events if e.kind == "verdict")
            assert verdict.data["verdict"] == "idle" and "GPU 0 at 0% utilisation" in verdict.message
        else:
            time.sleep(3.0)
            assert not [e for e in client.events("idle").events if e.kind == "verdict"]
        assert client.status("idle").jobs[0].state == "running"  # warned, never killed by default
        client.stop("idle", grace_s=1.0)
