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
    for folder in ("vllm-logs", "full-logs", "device-logs"):
        for label in tomllib.loads((CORPUS / folder / "labels.toml").read_text())["log"]:
            cases.append((CORPUS / folder / label["file"], label))
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


@pytest.mark.parametrize(("path", "label"), CASES, ids=[p.name for p, _ in CASES])
def test_outcome(path: Path, label: dict[str, Any], reports: dict[Path, ReplayReport]) -> None:
    aliases = POLICY["policy"]["outcome_aliases"]
    accepted = {aliases.get(o, o) for o in [label["outcome"], *label.get("outcome_accept", [])]}
    expected = _expected(label, "outcome", None)
    if expected is not None:
        accepted = {expected}
    assert reports[path].outcome.value in accepted


@pytest.mark.parametrize(("path", "label"), CASES, ids=[p.name for p, _ in CASES])
def test_last_phase(path: Path, label: dict[str, Any], reports: dict[Path, ReplayReport]) -> None:
    phase = label.get("last_phase_reached", label.get("last_phase"))
    accepted = {None if p == "unknown" else p for p in [phase, *label.get("last_phase_accept", [])]}
    expected = _expected(label, "last_phase", None)
    if expected is not None:
        accepted = {expected}
    got = reports[path].last_phase
    assert (got.value if got else None) in accepted


@pytest.mark.parametrize(("path", "label"), CASES, ids=[p.name for p, _ in CASES])
def test_failure(path: Path, label: dict[str, Any], reports: dict[Path, ReplayReport]) -> None:
    kind = _expected(label, "failure_kind", label["failure_kind"])
    failure = reports[path].failure
    if kind == "none":
        assert failure is None
        return
    assert failure is not None
    expected_kind = POLICY["policy"]["unknown_failure_kind"] if kind == "unknown" else kind
    assert failure.kind.value == expected_kind
    assert failure.fingerprint
    # The line the replay blames is the labelled error line (one may be a prefix-stripped
    # or cut-short form of the other).
    ours, theirs = failure.line.strip(), label["error_line"].strip()
    assert ours in theirs or theirs in ours, (ours, theirs)


@pytest.mark.parametrize(("path", "label"), [c for c in CASES if "shards_total" in c[1]],
                         ids=[p.name for p, lab in CASES if "shards_total" in lab])
def test_shard_counts(path: Path, label: dict[str, Any], reports: dict[Path, ReplayReport]) -> None:
    total = _expected(label, "shards_total", label["shards_total"])
    done = _expected(label, "shards_done", label.get("shards_done_last_seen", label.get("shards_done_last")))
    shards = [p for p in reports[path].progress if p.probe in SHARD_PROBES]
    if total == 0:
        assert shards == []
        return
    assert shards, "no shard progress seen"
    assert (shards[-1].done, shards[-1].total) == (done, total)


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
