"""Sharded jobs through a real daemon: shards at once, a failed shard relaunched alone, the gather
step, a deterministic failure on two shards stopping the job, a daemon SIGKILL mid-job, status,
the metrics and the report per shard, and bad values."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise
from prometheus_client.parser import text_string_to_metric_families

from supervisor.cli import report
from supervisor.core.events import EventKind

# argv: shard, num_shards, out dir, gate.  Shard 1 crashes on its first attempt; the others hold
# at the gate until the test has seen shard 1 relaunched, so all three run at once.
SHARD_JOB = """\
import os, sys, time
shard, num, out, gate = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
print(f"shard {shard} of {num} starting", flush=True)
marker = os.path.join(out, "crashed-once")
if shard == 1 and not os.path.exists(marker):
    open(marker, "w").close()
    raise KeyError("layers.0.weight_scale")
while shard != 1 and not os.path.exists(gate):
    time.sleep(0.02)
for i in range(1, 5):
    print(f"Loading checkpoint shards: {25*i}%|###| {i}/4 [00:00<00:01, 5.0it/s]", flush=True)
    time.sleep(0.02)
with open(os.path.join(out, f"part-{shard}-of-{num}"), "w") as f:
    f.write(f"{shard}\\n")
"""

GATHER_JOB = """\
import os, sys
out, num = sys.argv[1], int(sys.argv[2])
parts = [os.path.join(out, f"part-{i}-of-{num}") for i in range(num)]
missing = [p for p in parts if not os.path.exists(p)]
if missing:
    sys.exit(f"missing {missing}")
with open(os.path.join(out, "all.txt"), "w") as f:
    f.write("".join(open(p).read() for p in parts))
print("gathered", flush=True)
"""

# Every shard but the last dies of the same bug; the last holds until stopped.
SAME_BUG_JOB = """\
import sys, time
shard, num = int(sys.argv[1]), int(sys.argv[2])
if shard == num - 1:
    while True:
        time.sleep(0.05)
raise KeyError("layers.0.weight_scale")
"""


def _spec(home: Path, name: str, script: str, body: str, *, gather: str | None = None) -> Path:
    specs = home / "specs"
    specs.mkdir(exist_ok=True)
    (specs / f"{name}.py").write_text(script)
    gather_line = ""
    if gather is not None:
        (specs / f"{name}_gather.py").write_text(gather)
        gather_line = f'gather = ["{{python}}", "{specs / name}_gather.py", "{home}/out", "{{num_shards}}"]\n'
    path = specs / f"{name}.toml"
    path.write_text(f'name = "{name}"\n'
                    f'command = ["{{python}}", "{specs / name}.py", "{{shard}}", "{{num_shards}}", "{home}/out", "{home}/gate"]\n'
                    f'{gather_line}probes = ["python", "tqdm", "transformers"]\nstop_grace_s = 2\n{body}')
    (home / "out").mkdir(exist_ok=True)
    return path


def _shard_metrics(home: Path) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(home / "daemon.sock")), base_url="http://supervise") as http:
        text = http.get("/metrics").text
    if shutil.which("promtool"):
        lint = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30,
                              check=False)
        assert lint.returncode == 0 and not lint.stdout.strip(), lint.stdout + lint.stderr
    return {(s.name, frozenset(s.labels.items())): s.value for family in text_string_to_metric_families(text)
            for s in family.samples if s.name.startswith("supervise_shard_")}


def _shard_value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float | None:
    return samples.get((f"supervise_shard_{name}", frozenset(labels.items())))


def _attempts_by_shard(daemon: DaemonProcess, job: str) -> dict[int | None, list[int]]:
    found: dict[int | None, list[int]] = {}
    for a in daemon.client().attempts(job).attempts:
        found.setdefault(a.shard, []).append(a.n)
    return found


def test_three_shards_one_relaunched_alone_then_gather(daemon: DaemonProcess, home: Path, daemon_env) -> None:
    spec = _spec(home, "sh", SHARD_JOB, "shards = 3\n[restart]\nbackoff_initial_s = 0.1\nbackoff_jitter_s = 0\n",
                 gather=GATHER_JOB)
    out = supervise(daemon_env, "start", str(spec)).stdout
    # The run's first attempt, whichever shard's attempt the daemon saw first (it said "first attempt 3").
    assert "started sh: 3 shards, attempts from 1 (`supervise status sh` shows each)" in out, out
    client = daemon.client()
    # Shard 1 crashed and was relaunched while shards 0 and 2 kept their first attempts.
    wait_until(lambda: len(_attempts_by_shard(daemon, "sh").get(1, [])) == 2)
    by_shard = _attempts_by_shard(daemon, "sh")
    assert len(by_shard[0]) == 1 and len(by_shard[2]) == 1
    assert {a.state for a in client.attempts("sh").attempts if a.shard in (0, 2)} == {"running"}
    first = client.attempts("sh").attempts
    crashed = next(a for a in first if a.shard == 1 and a.verdict == "crashed")
    assert crashed.action.startswith("relaunch")

    # While they run: one line for the job, then one per shard; --json carries the shard index.
    wait_until(lambda: len([a for a in client.attempts("sh").attempts if a.shard == 1 and a.verdict == "done"]) == 1)
    text = supervise(daemon_env, "status", "sh").stdout.splitlines()
    assert re.match(r"sh: running  shards 1/3 done, 2 running, 0 failed", text[0]), text
    assert [line.split()[:3] for line in text[1:4]] == [["shard", "0", "running"], ["shard", "1", "done"],
                                                        ["shard", "2", "running"]]
    assert "attempts 2" in text[2] and "attempts 1" in text[1]
    shards = json.loads(supervise(daemon_env, "status", "sh", "--json").stdout)["jobs"][0]["shards"]
    assert (shards["total"], shards["done"], shards["running"]) == (3, 1, 2)
    assert [s["shard"] for s in shards["shards"]] == [0, 1, 2]
    assert shards["shards"][1]["attempt"]["shard"] == 1
    # The metrics carry each shard: its state, its attempts in this run, its bar.
    samples = _shard_metrics(home)
    assert _shard_value(samples, "state", job="sh", shard="1", state="done") == 1.0
    assert _shard_value(samples, "state", job="sh", shard="0", state="running") == 1.0
    assert _shard_value(samples, "state", job="sh", shard="0", state="done") == 0.0
    assert [_shard_value(samples, "attempts", job="sh", shard=str(i)) for i in range(3)] == [1.0, 2.0, 1.0]
    assert _shard_value(samples, "progress_done", job="sh", shard="1", probe="transformers.checkpoint_shards") == 4.0

    (home / "gate").write_text("")
    wait_until(lambda: job_state(client, "sh") == "done")
    assert (home / "out" / "all.txt").read_text() == "0\n1\n2\n"
    attempts = client.attempts("sh").attempts
    gather = [a for a in attempts if a.shard == -1]
    assert len(gather) == 1 and gather[0].verdict == "done"
    # The gather ran once, after every shard had ended.
    assert gather[0].started >= max(a.ended or 0 for a in attempts if a.shard != -1)
    assert len({a.run for a in attempts}) == 1
    final = supervise(daemon_env, "status", "sh").stdout.splitlines()
    assert final[0].startswith("sh: done  shards 3/3 done, 0 running, 0 failed")
    assert final[4].split()[:2] == ["gather", "done"] and final[5].startswith("GPUs:")
    samples = _shard_metrics(home)
    assert _shard_value(samples, "state", job="sh", shard="gather", state="done") == 1.0
    # The counters of failures, verdicts and launches, per shard (the crash was shard 1's first attempt).
    assert _shard_value(samples, "failures_total", job="sh", shard="1", kind="key_error") == 1.0
    assert _shard_value(samples, "failures_total", job="sh", shard="0", kind="key_error") is None
    assert _shard_value(samples, "verdicts_total", job="sh", shard="1", verdict="crashed") == 1.0
    assert _shard_value(samples, "verdicts_total", job="sh", shard="1", verdict="done") == 1.0
    assert [_shard_value(samples, "launches_total", job="sh", shard=s) for s in ("0", "1", "2", "gather")] == [1, 2, 1, 1]
    assert _shard_value(samples, "state", job="sh", shard="2", state="done") == 1.0

    # The report labels each attempt's lane with its shard, and its table has a shard column.
    page = home / "sh-report.html"
    supervise(daemon_env, "report", "sh", "--out", str(page))
    text = page.read_text()
    assert "<th>shard</th>" in text and text.count("<tr><td>#") == 5
    for a in attempts:
        assert f"<tr><td>#{a.n}</td><td>{'gather' if a.shard == -1 else a.shard}</td>" in text
    figure = report.build_figure(report.fetch_history(client, "sh"))
    ticks = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert sorted(ticks) == sorted(report.lane_label(a) for a in attempts) and "#5 gather" in ticks, ticks
    assert f"#{crashed.n} shard 1" in ticks


def test_same_failure_on_two_shards_stops_the_job(daemon: DaemonProcess, home: Path, daemon_env) -> None:
    spec = _spec(home, "bug", SAME_BUG_JOB,
                 "shards = 3\n[restart]\nmax_attempts = 5\nbackoff_initial_s = 60\nbackoff_jitter_s = 0\n",
                 gather="print('never')\n")
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: job_state(client, "bug") == "failed", timeout=30)
    job = client.status("bug").jobs[0]
    assert "the same failure" in job.reason and "shards 0 and 1" in job.reason.replace("1 and 0", "0 and 1")
    attempts = client.attempts("bug").attempts
    # One attempt each: neither crashing shard waited out its backoff; the healthy one was stopped.
    assert sorted(a.shard for a in attempts) == [0, 1, 2]
    assert next(a for a in attempts if a.shard == 2).state == "stopped"
    assert all(a.state != "running" for a in attempts)
    assert not any(a.shard == -1 for a in attempts)  # no gather after a failure


# argv: shard, num_shards, out dir, gate dir.  Every attempt is logged to out/runs; shard 0 ends at
# once, shard 1 crashes on its first attempt and then holds at gate-1, shard 2 holds at gate-2.
RESTART_JOB = """\
import os, sys, time
shard, num, out, gates = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
with open(os.path.join(out, "runs"), "a") as f:
    f.write(f"shard{shard}\\n")
marker = os.path.join(out, "crashed-once")
if shard == 1 and not os.path.exists(marker):
    open(marker, "w").close()
    raise KeyError("layers.0.weight_scale")
while shard and not os.path.exists(os.path.join(gates, f"gate-{shard}")):
    time.sleep(0.02)
print(f"Loading checkpoint shards: 100%|###| 4/4 [00:00<00:00, 5.0it/s]", flush=True)
with open(os.path.join(out, f"part-{shard}-of-{num}"), "w") as f:
    f.write(f"{shard}\\n")
"""

RESTART_GATHER = """\
import os, sys
out = sys.argv[1]
with open(os.path.join(out, "runs"), "a") as f:
    f.write("gather\\n")
print("gathered", flush=True)
"""


def test_daemon_sigkill_mid_sharded_job_readopts_every_shard(daemon: DaemonProcess, home: Path, daemon_env) -> None:
    spec = _spec(home, "rs", RESTART_JOB, "shards = 3\n[restart]\nbackoff_initial_s = 0.1\nbackoff_jitter_s = 0\n",
                 gather=RESTART_GATHER)
    (home / "gates").mkdir()
    spec.write_text(spec.read_text().replace(f'"{home}/gate"]', f'"{home}/gates"]'))
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()

    def standing() -> bool:
        attempts = client.attempts("rs").attempts
        running = {a.shard for a in attempts if a.state == "running"}
        return running == {1, 2} and any(a.shard == 0 and a.verdict == "done" for a in attempts) \
            and len([a for a in attempts if a.shard == 1]) == 2

    wait_until(standing)  # shard 0 done, shard 1 relaunched after its crash, shard 2 on its first attempt
    before = client.attempts("rs").attempts
    events_before = client.events("rs").events
    daemon.kill()  # SIGKILL: nothing is said to the store
    (home / "gates" / "gate-2").touch()  # shard 2 ends while no daemon watches it
    wait_until(lambda: (home / "out" / "part-2-of-3").exists())
    daemon.start()
    client = daemon.client()
    wait_until(lambda: job_state(client, "rs") == "running" and
               {a.shard for a in client.attempts("rs").attempts if a.verdict == "done"} == {0, 2})
    (home / "gates" / "gate-1").touch()
    wait_until(lambda: job_state(client, "rs") == "done")

    attempts = client.attempts("rs").attempts
    # Nothing lost, nothing doubled: the same attempts (numbers, pids, run), each ended once, one gather.
    assert [(a.n, a.shard, a.pid, a.run) for a in attempts[:len(before)]] == [(a.n, a.shard, a.pid, a.run) for a in before]
    assert {s: len(ns) for s, ns in _attempts_by_shard(daemon, "rs").items()} == {0: 1, 1: 2, 2: 1, -1: 1}
    assert len({a.run for a in attempts}) == 1
    crashed = next(a for a in attempts if a.shard == 1 and a.run_attempt == 1)
    assert crashed.verdict == "crashed" and all(a.verdict == "done" for a in attempts if a is not crashed)
    assert sorted((home / "out" / "runs").read_text().split()) == ["gather", "shard0", "shard1", "shard1", "shard2"]
    events = client.events("rs").events
    assert [e.id for e in events[:len(events_before)]] == [e.id for e in events_before]
    for kind in (EventKind.LAUNCHED, EventKind.EXITED, EventKind.VERDICT):
        per_attempt = [e.attempt for e in events if e.kind is kind]
        assert sorted(per_attempt) == sorted(a.n for a in attempts), (kind, per_attempt)
    progress = [(e.attempt, e.data.get("done")) for e in events if e.kind is EventKind.PROGRESS]
    assert len(progress) == len(set(progress)), progress  # no line read twice across the restart


# Shard 1 fails on each attempt, each time another way (no "same failure twice"); the others end at once.
FAILING_SHARD_JOB = """\
import os, sys
shard, out = int(sys.argv[1]), sys.argv[3]
with open(os.path.join(out, "runs"), "a") as f:
    f.write(f"shard{shard}\\n")
if shard == 1:
    tries = len([l for l in open(os.path.join(out, "runs")) if l.strip() == "shard1"])
    raise [KeyError, ValueError, TypeError, OSError][tries - 1](f"attempt {tries}")
"""


def test_daemon_sigkill_during_a_shards_backoff_keeps_its_attempt_budget(daemon: DaemonProcess, home: Path,
                                                                         daemon_env) -> None:
    spec = _spec(home, "bk", FAILING_SHARD_JOB,
                 "shards = 3\n[restart]\nmax_attempts = 2\nbackoff_initial_s = 4\nbackoff_jitter_s = 0\n",
                 gather=RESTART_GATHER)
    supervise(daemon_env, "start", str(spec))
    client = daemon.client()
    wait_until(lambda: (s := client.status("bk").jobs[0].shards) is not None and s.shards[1].state == "backoff"
               and s.done == 2)
    daemon.kill()  # SIGKILL during shard 1's backoff: no attempt of the job is live
    daemon.start()
    client = daemon.client()
    # The restarted daemon takes the job up again: the rest of shard 1's backoff, counted down ...
    shard = client.status("bk").jobs[0].shards.shards[1]  # type: ignore[union-attr]
    if len(client.attempts("bk").attempts) == 3:  # not relaunched yet (a slow restart may take the whole wait)
        assert shard.state == "backoff" and shard.next_relaunch_in_s is not None and shard.next_relaunch_in_s <= 4
    # ... then its second (last) attempt, and the job fails.
    wait_until(lambda: job_state(client, "bk") == "failed", timeout=60)
    attempts = client.attempts("bk").attempts
    first, second = [a for a in attempts if a.shard == 1]
    assert second.started >= (first.ended or 0) + 4 - 0.05  # the backoff held across the restart
    assert {s: len(ns) for s, ns in _attempts_by_shard(daemon, "bk").items()} == {0: 1, 1: 2, 2: 1}
    assert [a.run_attempt for a in attempts if a.shard == 1] == [1, 2] and len({a.run for a in attempts}) == 1
    assert (home / "out" / "runs").read_text().split().count("shard1") == 2  # the budget held across the restart
    assert "shard 1" in client.status("bk").jobs[0].reason


@pytest.mark.parametrize("body, args, words", [
    ("shards = 0\n", [], "shards"),
    ("", ["--shards", "-1"], "shards"),
    ("shards = 3\n[gpu]\ndevices = [0, 1, 2, 3]\ndevices_per_shard = 3\n", [], "does not divide"),
    ("shards = 3\n[gpu]\ndevices = [0, 1]\ndevices_per_shard = 1\n", [], "lower shards"),
])
def test_bad_shard_values_are_one_line_65(daemon_env, home: Path, body: str, args: list[str], words: str) -> None:
    spec = _spec(home, "badshards", "print('x')\n", body)
    result = supervise(daemon_env, "start", str(spec), *args, check=False)
    assert result.returncode == 65, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], lines
