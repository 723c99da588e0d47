"""`supervise probe` keeps listed events in a spool on disk, not in memory: its output is the
report's own, byte for byte, on every corpus log, when events are left out past the cap,
and through the CLI; and its memory does not grow with the events listed."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from probe_golden import corpus_logs

from supervisor.probes import _replay
from supervisor.probes._replay import replay_file
from supervisor.probes._spool import EventSpool

REPO = Path(__file__).resolve().parents[1]


def _spooled(path: Path, *, as_json: bool) -> str:
    spool = EventSpool(keep_json=as_json)
    try:
        report = replay_file(path, spool=spool)
        if not as_json:
            return report.render_text()
        out = io.StringIO()
        spool.write_json(report, out)
        return out.getvalue()
    finally:
        spool.close()


@pytest.mark.parametrize("path", corpus_logs(), ids=lambda p: p.name)
def test_spooled_report_is_the_reports_own(path: Path) -> None:
    report = replay_file(path)
    assert _spooled(path, as_json=True) == report.to_json() + "\n"
    assert _spooled(path, as_json=False) == report.render_text()


def test_spooled_report_with_events_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    path = REPO / "tests/data/corpus/full-logs/05-llamafactory-lora-train-done.log"
    monkeypatch.setattr(_replay, "_MAX_EVENTS", 7)
    report = replay_file(path)
    assert report.events_omitted > 0 and len(report.events) == 7
    assert _spooled(path, as_json=True) == report.to_json() + "\n"
    assert _spooled(path, as_json=False) == report.render_text()


def test_probe_cli_prints_the_report() -> None:
    path = REPO / "tests/data/corpus/vllm-logs/07-crash-mid-shard-loading.log"
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "probe", "--json", str(path)],
                            capture_output=True, text=True, cwd=REPO, check=False, timeout=120)
    assert result.returncode == 1, result.stderr  # the log shows a crash
    assert result.stdout == replay_file(path).to_json() + "\n"
    assert json.loads(result.stdout)["outcome"] == "crashed"


def test_spool_holds_no_event_in_memory(tmp_path: Path) -> None:
    log = tmp_path / "bars.log"
    log.write_text("".join(f"{{'loss': 0.5, 'grad_norm': 1.0, 'learning_rate': 3e-05, 'epoch': {i}}}\n" for i in range(3000)))
    spool = EventSpool(keep_json=True)
    try:
        report = replay_file(log, spool=spool)
        assert report.events == [] and spool.count == sum(report.counts.values()) == 3000
        assert len(spool.highlights) <= 1 + len(set(report.counts))  # not one per event
    finally:
        spool.close()
