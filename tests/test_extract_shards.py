"""Sharded extraction: N shards' files are the unsharded output byte for byte, `gather` writes the
manifest and token counts training reads, and refuses a missing or foreign shard in one line."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")
pytest.importorskip("transformers", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

from extract_helpers import build_test_model, output_files, reference_run, run_cli

# eagle3 lives in jobs/: importable only once extract_helpers has put jobs/ on the path.
# isort: split
from eagle3 import extract

N = 10  # samples
BATCH = 2


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_test_model(tmp_path_factory.getbasetemp())


@pytest.fixture(scope="module")
def reference(tmp_path_factory, model_dir):
    return reference_run(tmp_path_factory.getbasetemp(), model_dir, N, BATCH)


class _Ran:
    def __init__(self, returncode: int, stdout: str) -> None:
        self.returncode, self.stdout = returncode, stdout


def _shard(capsys, model_dir, out, shard: int, num: int, *extra: str) -> _Ran:
    """One shard, in this process (torch is imported once for the module's tests)."""
    try:
        rc = extract.main(["--model", str(model_dir), "--out", str(out), "--max-samples", str(N),
                           "--batch-size", str(BATCH), "--shard", str(shard), "--num-shards", str(num), *extra])
    except extract.OutputMismatch as e:  # raised: the job's traceback names it
        rc = 1
        print(e)
    return _Ran(rc, capsys.readouterr().out)


def _gather(out):
    return run_cli(["gather", "--out", str(out)])  # the real entry point, as the job's gather step runs it


def test_shards_then_gather_equal_the_unsharded_output_byte_for_byte(tmp_path, model_dir, reference, capsys) -> None:
    out = tmp_path / "sharded"
    for shard in (2, 0, 1):  # any order: shard 1 takes batches 1 and 4 (samples 2, 3, 8, 9) of 2 samples
        r = _shard(capsys, model_dir, out, shard, 3)
        assert r.returncode == 0, r.stdout
    part = json.loads((out / "manifest.shard-1-of-3.json").read_text())
    assert part["status"] == "complete" and part["shard"] == {"index": 1, "num_shards": 3, "samples": 4,
                                                                 "batch_size": BATCH}
    assert "extract resume: 4/4 samples already finished" in _shard(capsys, model_dir, out, 1, 3).stdout
    assert not (out / "manifest.json").exists()
    hidden = {k: v for k, v in output_files(out).items() if k.startswith("hs_")}
    assert hidden == {k: v for k, v in reference.items() if k.startswith("hs_")}  # the union of the parts

    r = _gather(out)
    assert r.returncode == 0 and r.stdout.startswith(f"extract gathered: {N} samples"), r.stdout
    gathered = {k: v for k, v in output_files(out).items() if ".shard-" not in k}
    assert gathered == reference  # manifest, token_freq, prepared data and samples: as one run writes them


def test_gather_refuses_a_missing_shard_and_other_settings_in_one_line(tmp_path, model_dir, capsys) -> None:
    out = tmp_path / "o"
    assert _shard(capsys, model_dir, out, 0, 2).returncode == 0
    r = _gather(out)
    assert r.returncode == 78 and r.stdout.strip().splitlines() == [
        f"extract gather refused: shard 1 of 2 is missing (no manifest.shard-1-of-2.json in {out}): run it, then gather"]
    # Shard 1 made with other settings elsewhere, its manifest then copied in: refused by gather.
    other = tmp_path / "other"
    assert _shard(capsys, model_dir, other, 1, 2, "--max-seq-len", "7").returncode == 0
    shutil.copy(other / "manifest.shard-1-of-2.json", out)
    r = _gather(out)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 78 and len(lines) == 1 and "shard 1 was made with other settings" in lines[0], lines
    assert not (out / "manifest.json").exists()


def test_a_shard_with_other_settings_is_refused_before_it_runs(tmp_path, model_dir, capsys) -> None:
    out = tmp_path / "o"
    assert _shard(capsys, model_dir, out, 0, 2).returncode == 0
    r = _shard(capsys, model_dir, out, 1, 2, "--layer-ids", "1,2")
    assert r.returncode != 0 and "made with other settings (differs in: layer_ids)" in r.stdout
    r = _shard(capsys, model_dir, out, 1, 3)
    assert r.returncode != 0 and "--num-shards 2" in r.stdout
    assert not any(out.glob("manifest.shard-1-*")) and not any(out.glob("token_freq.shard-1-*"))
