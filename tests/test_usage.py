"""What an attempt used: CPU seconds (and peak memory and tasks where the controllers keep them)
from its cgroup, GPU memory and GPU-seconds from the GPU samples of its processes; stored with the
attempt and shown by `attempts`, `status`, `accounting`, the metrics and `--json`."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise
from test_gpu_gating import HOLD_MIB, ProcessBoundNvml, in_process_daemon

from supervisor.cli.accounting import Row, _print_table, accounting
from supervisor.core.usage import AttemptUsage, GpuUsageMeter
from supervisor.hosts.local import cgroup
from supervisor.hosts.local.cgroup import ContainmentKind

# About 0.6 s of CPU, then a child that uses some too (a cgroup counts the whole tree).
BURNER = """\
import subprocess, sys, time
end = time.process_time() + 0.4
while time.process_time() < end:
    pass
subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 0.2\\nwhile time.process_time() < end: pass"])
print("burnt", flush=True)
"""
CGROUPS = cgroup.detect().kind is ContainmentKind.CGROUP


def test_the_gpu_meter_counts_gpus_held_times_time_and_the_peak_per_gpu() -> None:
    meter = GpuUsageMeter()
    meter.sampled(100.0, {0: 1000, 1: 500})
    meter.sampled(102.0, {0: 3000, 1: 400})  # 2 GPUs x 2 s
    meter.sampled(103.0, {0: 10})  # 2 GPUs x 1 s
    meter.sampled(503.0, {})  # a gap (daemon down): 1 GPU x 60 s at most
    meter.sampled(504.0, {})
    assert GpuUsageMeter().usage().gpu_s is None  # never sampled (its host's GPUs unreadable): unknown, not 0
    used = meter.usage()
    assert used.gpu_s == 4 + 2 + 60 and used.gpu_peak_mib == {0: 3000, 1: 500}
    assert used.with_host(AttemptUsage(cpu_s=1.5, peak_memory_mib=20, peak_tasks=3)).model_dump() == {
        "cpu_s": 1.5, "peak_memory_mib": 20, "peak_memory_sampled": False, "peak_tasks": 3, "gpu_peak_mib": {0: 3000, 1: 500},
        "gpu_s": 66.0}


def test_an_attempt_on_a_gpu_stores_its_gpu_memory_peak_and_gpu_seconds(tmp_path: Path) -> None:
    holders = tmp_path / "holders"
    holders.mkdir()
    script = tmp_path / "gpu_job.py"
    script.write_text("import os, time\n"
                      f"open('{holders}/' + str(os.getpid()) + '.pid', 'w').write(str(os.getpid()))\n"
                      "print('working', flush=True)\ntime.sleep(2.0)\n")
    spec = tmp_path / "gpujob.toml"
    spec.write_text(f'name = "gpujob"\ncommand = ["{sys.executable}", "{script}"]\nstop_grace_s = 1\n'
                    "[gpu]\nrelease_timeout_s = 20\nrelease_tolerance_mib = 100\n")
    with in_process_daemon(ProcessBoundNvml(holders)) as client:
        client.start(str(spec), {})
        wait_until(lambda: client.status("gpujob").jobs[0].state in ("done", "failed"), timeout=60)
        used = client.attempts("gpujob").attempts[0].usage
        assert used is not None and used.gpu_peak_mib == {0: HOLD_MIB}, used
        assert 1.0 <= used.gpu_s <= 4.0, used  # one GPU for the ~2 s it ran (sampled every 0.1 s)
        if CGROUPS:
            assert used.cpu_s is not None and used.cpu_s > 0
        rows = accounting(client, None, time.time())
        assert [(r.job, r.state, r.exit_code) for r in rows] == [("gpujob", "done", 0)]
        assert rows[0].gpu_hours == round(used.gpu_s / 3600, 4)
        assert f'supervise_job_attempt_gpu_seconds{{job="gpujob"}} {used.gpu_s}' in client._http.get("/metrics").text


def test_accounting_lists_every_attempt_as_sacct_does(daemon: DaemonProcess, daemon_env: dict[str, str],
                                                      make_job: Callable[..., Path]) -> None:
    client = daemon.client()
    client.start(str(make_job("burner", BURNER)), {})
    wait_until(lambda: job_state(client, "burner") == "done", timeout=60)
    attempt = client.attempts("burner").attempts[0]
    if CGROUPS:  # the cgroup's cpu.stat: the job and its child, 0.6 s of CPU between them
        assert attempt.usage is not None and attempt.usage.cpu_s is not None and 0.5 <= attempt.usage.cpu_s < 5.0, \
            attempt.usage
        metrics = client._http.get("/metrics").text
        assert f'supervise_job_attempt_cpu_seconds{{job="burner"}} {attempt.usage.cpu_s}' in metrics
        assert "used: cpu " in supervise(daemon_env, "attempts", "burner").stdout
        assert "  used cpu " in supervise(daemon_env, "status", "burner").stdout
    assert attempt.usage is None or attempt.usage.gpu_s is None  # no GPU could be read here: unknown, not 0
    as_json = [json.loads(line) for line in supervise(daemon_env, "accounting", "--json").stdout.splitlines()]
    assert [(r["job"], r["attempt"], r["state"], r["exit_code"], r["host"]) for r in as_json] == [
        ("burner", 1, "done", 0, "local")]
    assert as_json[0]["end"] == attempt.ended and as_json[0]["duration_s"] == round(attempt.ended - attempt.started, 3)
    table = list(csv.DictReader(io.StringIO(supervise(daemon_env, "accounting", "--csv").stdout)))
    assert [(r["job"], r["state"], r["exit_code"]) for r in table] == [("burner", "done", "0")]
    # Times as ISO-8601 with their offset, as people and spreadsheets read them; the duration in seconds.
    start, end = (dt.datetime.fromisoformat(table[0][key]) for key in ("start", "end"))
    assert start.utcoffset() is not None and table[0]["start"][10] == "T", table[0]
    assert abs(start.timestamp() - attempt.started) < 1 and abs(end.timestamp() - attempt.ended) < 1, table[0]
    assert float(table[0]["duration_s"]) == round(attempt.ended - attempt.started, 3)
    assert list(table[0]) == ["job", "attempt", "shard", "host", "start", "end", "duration_s", "state", "cpu_s",
                              "peak_memory_mib", "gpu_hours", "exit_code", "exit_signal"]
    text = supervise(daemon_env, "accounting").stdout.splitlines()
    assert text[0].split()[:3] == ["job", "#", "shard"] and text[1].startswith("burner") and " done " in text[1]
    later = (dt.datetime.now() + dt.timedelta(hours=1)).isoformat(sep=" ")
    assert supervise(daemon_env, "accounting", "--since", later).stdout == "no attempts\n"
    assert len(supervise(daemon_env, "accounting", "--since", "1h", "--json").stdout.splitlines()) == 1
    for bad in (["--since", "soon"], ["--json", "--csv"], ["--since", ""]):
        out = supervise(daemon_env, "accounting", *bad, check=False)
        assert out.returncode == 2 and out.stdout == "" and out.stderr.strip().splitlines()[-1].startswith(
            "supervise accounting: error: "), (bad, out.stderr)
    assert client.ping().pid == daemon.proc.pid


@pytest.mark.skipif(not CGROUPS, reason="no cgroup v2 for attempts here")
def _cpu_s(pid: int | None) -> float:
    """CPU seconds of ``pid`` and its children (the attempt's program and what it started)."""
    if pid is None:
        return 0.0
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
        return sum(p.cpu_times().user + p.cpu_times().system for p in procs)
    except psutil.Error:
        return 0.0


def test_a_killed_attempt_keeps_what_its_cgroup_counted(daemon: DaemonProcess, make_job: Callable[..., Path]) -> None:
    # The kill removes the cgroup: its figures are read first.
    client = daemon.client()
    client.start(str(make_job("spinner", BURNER.replace('print("burnt", flush=True)', "time.sleep(60)"))), {})
    wait_until(lambda: client.status("spinner").jobs[0].attempt is not None, timeout=30)
    # Until it has burnt half a second of CPU, however loaded the machine (wall time alone was not:
    # at load 10 on two cores, 1.5 s of it gave the spinner under 0.4 s of CPU).
    wait_until(lambda: _cpu_s(client.status("spinner").jobs[0].attempt.pid) >= 0.5, timeout=60)
    client.stop("spinner", 1.0)
    wait_until(lambda: job_state(client, "spinner") == "stopped", timeout=30)
    used = client.attempts("spinner").attempts[0].usage
    assert used is not None and used.cpu_s is not None and used.cpu_s >= 0.4, used


def test_accounting_table_cuts_no_host_or_job_name(capsys: pytest.CaptureFixture[str]) -> None:
    """A host is shown as sacct's NodeList shows one (no scheme, no login); long names are not cut."""
    rows = [Row(job="extract-qwen3-235b-shard-07", attempt=1, shard=7, host="ssh://me@gpu-box-17.example:2222",
                start=0.0, end=60.0, duration_s=60.0, state="done", cpu_s=1.0, peak_memory_mib=10, gpu_hours=None,
                exit_code=0, exit_signal=None),
            Row(job="t", attempt=2, shard=None, host="local", start=0.0, end=None, duration_s=5.0, state="running",
                cpu_s=None, peak_memory_mib=None, gpu_hours=None, exit_code=None, exit_signal=None)]
    _print_table(rows)
    lines = capsys.readouterr().out.splitlines()
    assert "extract-qwen3-235b-shard-07" in lines[1] and " gpu-box-17.example:2222 " in lines[1]
    assert "ssh://" not in lines[1] and "me@" not in lines[1]
    assert lines[2].split()[:4] == ["t", "2", "-", "local"]
    assert lines[0].index("host") == lines[1].index("gpu-box") == lines[2].index("local")


def test_peak_memory_is_known_where_the_cgroup_does_not_count_it(daemon: DaemonProcess, daemon_env: dict[str, str],
                                                                 make_job: Callable[..., Path]) -> None:
    # 200 MiB held for 2.5 s: the cgroup's memory.peak says it where the memory controller reaches
    # the attempt; elsewhere (no controller delegated, no cgroup) its processes' RSS is sampled.
    client = daemon.client()
    client.start(str(make_job("holder", "import time\nheld = bytearray(200 * 1024 * 1024)\n"
                                        "print('holding', flush=True)\ntime.sleep(2.5)\n")), {})
    wait_until(lambda: job_state(client, "holder") == "done", timeout=60)
    used = client.attempts("holder").attempts[0].usage
    assert used is not None and used.peak_memory_mib is not None and 200 <= used.peak_memory_mib < 1024, used
    shown = supervise(daemon_env, "status", "holder").stdout
    marked = " (sampled)" if used.peak_memory_sampled else ""
    assert re.search(rf"peak memory \d+(\.\d)? MiB{re.escape(marked)}", shown), shown
