"""A hung serving engine and a diverging training loss, through a real daemon with real
processes printing the lines vLLM and the HF Trainer print: warned about by default (the
job runs on), killed where the spec asks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state

from supervisor.cli.client import Client

# vLLM's V1 API server once ready, then its engine stuck: the throughput line every 0.2 s
# (10 s in vLLM) says 0 tokens/s with requests running and waiting, and /health still answers.
HUNG_SERVER = """\
import sys, time
print("INFO 12-03 10:00:00 [api_server.py:1000] Starting vLLM API server 0 on http://0.0.0.0:8000", flush=True)
print("INFO:     Application startup complete.", flush=True)
for i in range(600):
    print('INFO:     127.0.0.1:40000 - "GET /health HTTP/1.1" 200 OK', flush=True)
    print("INFO 12-03 10:00:10 [loggers.py:127] Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation "
          "throughput: 0.0 tokens/s, Running: 3 reqs, Waiting: 9 reqs, GPU KV cache usage: 97.0%, Prefix cache hit "
          "rate: 0.0%", flush=True)
    time.sleep(0.2)
"""

# The HF Trainer's log dicts: a loss going down, then NaN, then training goes on to its end.
NAN_TRAINER = """\
import time
for i in range(12):
    print(f"{{'loss': {2.0 - i * 0.1:.4f}, 'grad_norm': 1.5, 'learning_rate': 1e-05, 'epoch': {i / 100:.2f}}}", flush=True)
    time.sleep(0.05)
for i in range(30):
    print("{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.5}", flush=True)
    time.sleep(0.1)
"""

PACKS = '["python", "vllm", "uvicorn", "transformers"]'


def verdicts(client: Client, job: str) -> list[str]:
    return [e.data.get("verdict") for e in client.events(job).events if e.kind == "verdict"]


def test_a_hung_engine_is_warned_about_and_runs_on_by_default(daemon: DaemonProcess, make_job: Callable[..., Path]) -> None:
    spec = make_job("hung", HUNG_SERVER, probes=PACKS, extra="[health]\nhung_s = 1.5\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: "hung" in verdicts(client, "hung"), timeout=30)
    job = client.status("hung").jobs[0]
    assert job.state == "running" and job.attempt.state == "running"
    assert "engine hung: 0 tokens/s with 3 running and 9 waiting" in (job.attempt.reason or ""), job.attempt
    assert 'health.hung_action is "warn"' in (job.reason or ""), job.reason
    client.stop("hung", grace_s=1.0)


def test_a_hung_engine_is_killed_and_relaunched_where_the_spec_asks(
        daemon: DaemonProcess, make_job: Callable[..., Path]) -> None:
    spec = make_job("hungkill", HUNG_SERVER, probes=PACKS,
                    extra="[health]\nhung_s = 1.0\nhung_action = \"kill\"\n"
                          "[restart]\nmax_attempts = 2\nbackoff_initial_s = 0\nbackoff_jitter_s = 0\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "hungkill") == "failed", timeout=60)
    attempts = client.attempts("hungkill").attempts
    assert [a.verdict for a in attempts] == ["hung", "hung"], [(a.verdict, a.reason) for a in attempts]


def test_a_nan_loss_is_diverged_warned_about_and_the_job_runs_to_its_end(
        daemon: DaemonProcess, make_job: Callable[..., Path]) -> None:
    spec = make_job("nan", NAN_TRAINER, probes=PACKS)
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: "diverged" in verdicts(client, "nan"), timeout=30)
    wait_until(lambda: job_state(client, "nan") in ("done", "failed"), timeout=30)
    assert job_state(client, "nan") == "done"  # warned, not killed: it exited 0 on its own
    alerts = [e.message for e in client.events("nan").events if e.kind == "action" or e.kind == "verdict"]
    assert any("training diverged: loss is nan" in m for m in alerts), alerts


def test_a_nan_loss_with_diverge_action_kill_is_killed_and_not_relaunched(
        daemon: DaemonProcess, make_job: Callable[..., Path]) -> None:
    spec = make_job("nankill", NAN_TRAINER, probes=PACKS, extra="[health]\ndiverge_action = \"kill\"\n")
    client = daemon.client()
    client.start(str(spec), {})
    wait_until(lambda: job_state(client, "nankill") == "failed", timeout=30)
    attempts = client.attempts("nankill").attempts
    assert len(attempts) == 1 and attempts[0].verdict == "diverged", [(a.verdict, a.reason) for a in attempts]
