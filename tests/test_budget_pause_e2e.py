"""A paused extraction (jobs/eagle3/budget.py) and the trainer waiting on it are a known wait, not a stall.

Each side says it waits every ``--wait-report-s``; the packs read those lines as ``paused`` heartbeats
(probes/extract.toml, probes/train.toml), which hold the watchdog's stall clocks while they come
(supervisor/watchdog/_rules.py) and which `status` shows.  Under a real daemon with an 8 s stall floor, the
eagle3-budget pipeline pauses for longer than that and ends done."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")
pytest.importorskip("transformers", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

from extract_helpers import REPO
from train_helpers import THIRD_PARTY_WARNINGS

pytestmark = [pytest.mark.filterwarnings(w) for w in THIRD_PARTY_WARNINGS]

from eagle3 import budget

# Above what one batch takes to compute here (a training step: a few seconds on 2 busy cores), below a pause.
FLOOR_S = 8
# Not shorter: before their first line (torchrun, importing torch on 2 busy cores) the jobs print nothing, and
# silence before any phase is bounded by silence_s too. tests/test_watchdog_paused.py holds a wait to 3 s of it.
SILENCE_S = 30
# After each training step (test hook). Training takes one sample a step and extraction writes four a batch, so a
# step stays well under the floor while each pause (four steps and a checkpoint) lasts well over it.
# Four delays alone reach the floor (a pause under load once measured 7.6 s with 1.5 s delays).
STEP_DELAY_S = 2.0


@pytest.fixture
def daemon_env(daemon_env: dict[str, str]) -> dict[str, str]:
    # The daemon's environment is its jobs': training steps slowed, so that each pause outlasts the floor.
    return {**daemon_env, "EAGLE3_TRAIN_STEP_DELAY_S": str(STEP_DELAY_S)}


def _specs(tmp: Path) -> Path:
    """The shipped pipeline and jobs, with a short stall floor (as a user would write them)."""
    jobs = REPO / "jobs"
    for name in ("extract", "train"):
        text = (jobs / f"{name}.toml").read_text().replace("{spec_dir}", str(jobs))
        text = re.sub(r"(?m)^stall_floor_s = \d+$", f"stall_floor_s = {FLOOR_S}", text)
        text = re.sub(r"(?m)^silence_s = \d+$", f"silence_s = {SILENCE_S}", text)
        assert f"stall_floor_s = {FLOOR_S}" in text and f"silence_s = {SILENCE_S}" in text
        (tmp / f"{name}.toml").write_text(text)
    pipeline = tmp / "eagle3-budget.toml"
    pipeline.write_text((jobs / "eagle3-budget.toml").read_text())
    return pipeline


def _told(client) -> str:
    """Each attempt's verdict and reason, and its log's last lines: what a failure here shows."""
    told = []
    for name in ("extract", "train"):
        for a in client.attempts(f"eagle3-budget.{name}").attempts:
            tail = Path(a.log_path).read_text().splitlines()[-12:] if Path(a.log_path).is_file() else []
            told.append(f"{name} #{a.n}: {a.verdict} {a.reason}\n    " + "\n    ".join(tail))
    return "\n".join(told)


@pytest.mark.slow
@pytest.mark.timeout(300)  # two model loads on 2 busy cores and eight 2 s steps: about a minute
def test_a_paused_extraction_longer_than_the_stall_floor_is_not_killed_and_status_says_why(
        daemon, home: Path, tmp_path: Path) -> None:
    from conftest import wait_until

    from supervisor.cli.views import status_block
    from supervisor.core.events import JobState

    prompts = home / "prompts-8.jsonl"
    prompts.write_text("".join((REPO / "jobs" / "data" / "prompts.jsonl").read_text().splitlines(keepends=True)[:8]))
    client = daemon.client()
    # A budget below one sample: extraction writes a batch, then pauses until training has consumed it.
    client.start_pipeline(str(_specs(tmp_path)), {"disk_budget": "1kB", "extract.prompts": str(prompts),
                                                  "extract.wait_report_s": "0.5", "train.wait_report_s": "0.5",
                                                  "train.batch_size": "1", "train.log_every": "1"})
    seen: dict[str, str] = {}

    def ended():
        for name in ("extract", "train"):
            job = client.status(f"eagle3-budget.{name}").jobs[0]
            if job.paused is not None:
                seen.setdefault(name, status_block(job))
        status = client.status("eagle3-budget").pipelines[0]
        assert status.state not in (JobState.FAILED, JobState.CANCELLED), _told(client)
        return status if status.state is JobState.DONE else None

    status = wait_until(ended, timeout=280, interval=0.2)
    assert [s.state for s in status.steps] == [JobState.DONE, JobState.DONE]
    for step in status.steps:  # each in one attempt: never judged stalled or silent, never relaunched
        attempts = client.attempts(step.job).attempts
        assert [(a.verdict, a.run_attempt) for a in attempts] == [("done", 1)], _told(client)
    log = Path(client.attempts("eagle3-budget.extract").attempts[0].log_path).read_text()
    waits = [float(s) for s in re.findall(r"extract resumed after ([\d.]+)s", log)]
    assert waits and max(waits) > FLOOR_S, waits  # it did pause for longer than the floor
    # `status` said that it was paused, and why.
    assert re.search(r"\n  paused \S+ \(a known wait, not a stall\): extract paused: \d+ bytes not consumed yet.*"
                     r"waiting \d+s for training to release samples", seen["extract"]), seen
    assert "verdict healthy" in seen["extract"]
    data = home / "out" / "eagle3-budget" / "extract"
    assert budget.Ledger.read(data).through == 8 and not list(data.glob("hs_*.safetensors"))
    assert client.ping() is not None
