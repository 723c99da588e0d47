"""Every corpus log replayed through all built-in packs, checked against its labels.

Labels live next to the logs (tests/data/corpus/*/labels.toml); how they are read, and any
label overridden, is in tests/data/corpus_overrides.toml.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from supervisor.probes import ReplayReport, replay_file

DATA = Path(__file__).parent / "data"
CORPUS = DATA / "corpus"
POLICY: dict[str, Any] = tomllib.loads((DATA / "corpus_overrides.toml").read_text())
OVERRIDES = {(o["file"], o["field"]): o["value"] for o in POLICY["override"]}
SHARD_PROBES = set(POLICY["policy"]["shard_probes"])
REPO = Path(__file__).resolve().parents[1]


def _labels() -> list[tuple[Path, dict[str, Any]]]:
    cases = []
    for labels in sorted(CORPUS.glob("*/labels.toml")):
        for label in tomllib.loads(labels.read_text())["log"]:
            cases.append((labels.parent / label["file"], label))
    return cases


CASES = _labels()


def _expected(label: dict[str, Any], field: str, value: Any) -> Any:
    return OVERRIDES.get((label["file"], field), value)


@pytest.fixture(scope="module")
def reports() -> dict[Path, ReplayReport]:
    return {path: replay_file(path) for path, _ in CASES}


def test_every_corpus_log_is_labelled() -> None:
    logs = {p for p in CORPUS.rglob("*.log")}
    assert logs == {path for path, _ in CASES}


def outcome_ok(label: dict[str, Any], report: ReplayReport) -> bool:
    aliases = POLICY["policy"]["outcome_aliases"]
    accepted = {aliases.get(o, o) for o in [label["outcome"], *label.get("outcome_accept", [])]}
    expected = _expected(label, "outcome", None)
    if expected is not None:
        accepted = {expected}
    return report.outcome.value in accepted


def phase_ok(label: dict[str, Any], report: ReplayReport) -> bool:
    phase = label.get("last_phase_reached", label.get("last_phase"))
    unknown = {None if p == "none" else p for p in POLICY["policy"]["unknown_phase"]}
    accepted = {q for p in [phase, *label.get("last_phase_accept", [])] for q in (unknown if p == "unknown" else {p})}
    expected = _expected(label, "last_phase", None)
    if expected is not None:
        accepted = {None if expected == "none" else expected}  # "none": the replay reads no phase
    got = report.last_phase
    return (got.value if got else None) in accepted


def kind_ok(label: dict[str, Any], report: ReplayReport) -> bool:
    kind = _expected(label, "failure_kind", label["failure_kind"])
    failure = report.failure
    if kind == "none":
        return failure is None
    expected_kind = POLICY["policy"]["unknown_failure_kind"] if kind == "unknown" else kind
    accepted = {expected_kind} if (label["file"], "failure_kind") in OVERRIDES else {
        expected_kind, *label.get("failure_kind_accept", [])}
    return failure is not None and failure.kind.value in accepted and bool(failure.fingerprint)


def line_ok(label: dict[str, Any], report: ReplayReport) -> bool:
    # The line the replay blames is the labelled error line (one may be a prefix-stripped
    # or cut-short form of the other).
    failure = report.failure
    if label["failure_kind"] == "none":
        return failure is None
    if failure is None:
        return False
    ours, theirs = failure.line.strip(), _expected(label, "error_line", label["error_line"]).strip()
    return ours in theirs or theirs in ours


def shards_ok(label: dict[str, Any], report: ReplayReport) -> bool:
    total = _expected(label, "shards_total", label["shards_total"])
    done = _expected(label, "shards_done", label.get("shards_done_last_seen", label.get("shards_done_last")))
    shards = [p for p in report.progress if p.probe in SHARD_PROBES]
    if total == 0:
        return shards == []
    return bool(shards) and (shards[-1].done, shards[-1].total) == (done, total)


FIELDS = {"outcome": outcome_ok, "last_phase": phase_ok, "failure_kind": kind_ok, "error_line": line_ok,
          "shards": shards_ok}


@pytest.mark.parametrize(("path", "label"), CASES, ids=[p.name for p, _ in CASES])
def test_outcome(path: Path, label: dict[str, Any], reports: dict[Path, ReplayReport]) -> None:
    assert outcome_ok(label, reports[path]), reports[path].outcome


@pytest.mark.parametrize(("path", "label"), CASES, ids=[p.name for p, _ in CASES])
def test_last_phase(path: Path, label: dict[str, Any], reports: dict[Path, ReplayReport]) -> None:
    assert phase_ok(label, reports[path]), reports[path].last_phase


@pytest.mark.parametrize(("path", "label"), CASES, ids=[p.name for p, _ in CASES])
def test_failure(path: Path, label: dict[str, Any], reports: dict[Path, ReplayReport]) -> None:
    assert kind_ok(label, reports[path]), reports[path].failure
    assert line_ok(label, reports[path]), (reports[path].failure, label["error_line"])


@pytest.mark.parametrize(("path", "label"), [c for c in CASES if "shards_total" in c[1]],
                         ids=[p.name for p, lab in CASES if "shards_total" in lab])
def test_shard_counts(path: Path, label: dict[str, Any], reports: dict[Path, ReplayReport]) -> None:
    assert shards_ok(label, reports[path]), reports[path].progress


def test_every_label_cites_its_source() -> None:
    # A corpus log is only worth its labels if someone can find where it came from.
    missing = [label["file"] for _, label in CASES if not label.get("source", "").strip()]
    assert missing == []


def _score(cases: list[tuple[Path, dict[str, Any]]], reports: dict[Path, ReplayReport]) -> list[tuple[str, int, int]]:
    rows = []
    for field, check in FIELDS.items():
        scored = [(p, lab) for p, lab in cases if field != "shards" or "shards_total" in lab]
        rows.append((field, sum(check(lab, reports[p]) for p, lab in scored), len(scored)))
    return rows


def test_score_per_field(reports: dict[Path, ReplayReport], capsys: pytest.CaptureFixture[str]) -> None:
    """The corpus score per field, in all and per folder, as tests/perf/RESULTS.md keeps it (run with -s)."""
    rows = _score(CASES, reports)
    folders = sorted({p.parent.name for p, _ in CASES})
    per_folder = {f: _score([c for c in CASES if c[0].parent.name == f], reports) for f in folders}
    with capsys.disabled():
        print(f"\ncorpus score ({len(CASES)} logs)")
        print(f"  {'field':<13} {'all':>9}  " + "  ".join(f"{f:>12}" for f in folders))
        for i, (field, right, n) in enumerate(rows):
            cells = "  ".join(f"{per_folder[f][i][1]:>5}/{per_folder[f][i][2]:<6}" for f in folders)
            print(f"  {field:<13} {right:>4}/{n:<4}  {cells}")
        for p, lab in CASES:
            wrong = [field for field, check in FIELDS.items()
                     if (field != "shards" or "shards_total" in lab) and not check(lab, reports[p])]
            if wrong:
                print(f"  miss {p.parent.name}/{p.name}: {', '.join(wrong)}")
    assert all(right == n for _, right, n in rows), rows


def test_replay_through_the_cli() -> None:
    path = CORPUS / "vllm-logs" / "07-crash-mid-shard-loading.log"
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "probe", "--json", str(path)],
                            capture_output=True, text=True, cwd=REPO, timeout=60, check=False)
    assert result.returncode == 1, result.stderr  # a crash found, as grep signals a match
    data = json.loads(result.stdout)
    assert set(data) == {"outcome", "last_phase", "failure", "progress", "events"}
    assert data["outcome"] == "crashed"
    assert data["last_phase"] == "weight_loading"
    assert set(data["failure"]) == {"kind", "line", "fingerprint"}
    assert data["failure"]["kind"] == "other"
    assert {"probe": "vllm.shards", "bar": "Loading safetensors checkpoint shards", "process": "",
            "done": 41, "total": 49} in data["progress"]
