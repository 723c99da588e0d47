"""Bar paces in a real SQLite store: saved per attempt, read back as the next attempt's history
(same job, spec and host kind only; the latest runs), forgotten with the job."""

from __future__ import annotations

from pathlib import Path

from supervisor.core.events import JobState
from supervisor.jobs.paces import PaceStore, spec_fingerprint
from supervisor.spec.model import JobSpec
from supervisor.store.database import Store

BAR = "vllm.shards|Loading safetensors checkpoint shards"


def spec(**fields: object) -> JobSpec:
    return JobSpec.model_validate({"name": "serve", "command": ["vllm", "serve", "/m"], **fields})


def test_an_attempts_intervals_are_the_next_attempts_history(tmp_path: Path) -> None:
    paces = PaceStore(Store(tmp_path / "s.db"))
    fp = spec_fingerprint(spec())
    paces.save("serve", fp, "local", 1, {BAR: [17.0, 18.0], "other": []})
    paces.save("serve", fp, "local", 2, {BAR: [17.5]})
    history = paces.history("serve", fp, "local", before=3)
    pace = history.get(BAR)
    assert pace is not None and pace.intervals == (17.0, 17.5, 18.0) and pace.runs == 2
    assert history.get("other") is None
    # An attempt never reads its own intervals (re-adopted after a restart), nor later ones.
    assert paces.history("serve", fp, "local", before=2).get(BAR).intervals == (17.0, 18.0)
    # Saved again as it goes on: replaced, not added.
    paces.save("serve", fp, "local", 2, {BAR: [17.5, 19.0]})
    assert paces.history("serve", fp, "local", before=3).get(BAR).intervals == (17.0, 17.5, 18.0, 19.0)


def test_another_spec_or_host_kind_has_no_history(tmp_path: Path) -> None:
    paces = PaceStore(Store(tmp_path / "s.db"))
    fp = spec_fingerprint(spec())
    paces.save("serve", fp, "local/NVIDIA H200", 1, {BAR: [17.0]})
    other_model = spec_fingerprint(spec(command=["vllm", "serve", "/other"]))
    assert other_model != fp and spec_fingerprint(spec(env={"X": "1"})) != fp
    assert spec_fingerprint(spec(description="same work")) == fp
    assert len(paces.history("serve", other_model, "local/NVIDIA H200")) == 0
    assert len(paces.history("serve", fp, "local/NVIDIA A100")) == 0
    assert len(paces.history("other-job", fp, "local/NVIDIA H200")) == 0


def test_only_the_latest_runs_count_and_removing_the_job_forgets_them(tmp_path: Path) -> None:
    store = Store(tmp_path / "s.db")
    paces = PaceStore(store)
    fp = spec_fingerprint(spec())
    for n in range(1, 9):
        paces.save("serve", fp, "local", n, {BAR: [float(n)]})
    assert paces.history("serve", fp, "local").get(BAR).intervals == (4.0, 5.0, 6.0, 7.0, 8.0)
    store.upsert_job("serve", spec().model_dump(), JobState.DONE)
    store.delete_job("serve")
    assert len(paces.history("serve", fp, "local")) == 0
