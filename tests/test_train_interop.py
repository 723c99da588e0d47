"""Our trainer reads speculators' layout: the train fixture exported with ``eagle3.export --format
speculators``, its manifest removed (speculators' own data has none), so the layer ids come from
``--layer-ids`` and the target from ``--target-model``; the vocabulary comes from its ``token_freq.pt``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from train_helpers import JOBS, LAYER_IDS, THIRD_PARTY_WARNINGS, cli_env, make_fixture, torch_threads_kept, train_args

torch = pytest.importorskip("torch")
pytest.importorskip("datasets", reason="speculators' layout is a datasets directory (jobs/requirements-interop.txt)")
pytestmark = [pytest.mark.filterwarnings(w) for w in THIRD_PARTY_WARNINGS]

from eagle3 import train as T


@pytest.fixture(scope="module")
def spec_data(tmp_path_factory) -> tuple[Path, Path]:
    """(speculators-layout data without a manifest, the target model directory)."""
    ours = make_fixture(tmp_path_factory.getbasetemp() / "train-fixture")
    target = Path(json.loads((ours / "manifest.json").read_text())["model"])
    out = tmp_path_factory.mktemp("spec") / "data"
    r = subprocess.run([sys.executable, "-m", "eagle3.export", str(ours), str(out), "--format", "speculators"],
                       cwd=JOBS, env=cli_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=120, check=False)
    assert r.returncode == 0, r.stdout
    for name in ("manifest.json", "token_freq.safetensors", "prepared.safetensors"):
        (out / name).unlink(missing_ok=True)  # what speculators' own data directory does not have
    return out, target


def test_speculators_data_without_layer_ids_is_refused_in_one_line(spec_data, tmp_path):
    data, target = spec_data
    with pytest.raises(T.DataError, match=r"speculators' layout stores no layer ids; pass --layer-ids A,B,C,L"):
        T.setup(T.parse_args(train_args(data, tmp_path / "o", "--target-model", str(target))))


@pytest.mark.slow
def test_our_trainer_learns_from_speculators_layout(spec_data, tmp_path):
    data, target = spec_data
    ids = ",".join(map(str, LAYER_IDS))
    args = T.parse_args(train_args(data, tmp_path / "draft", "--target-model", str(target), "--layer-ids", ids,
                                   "--max-steps", "90", "--log-every", "30", "--save-every", "1000"))
    with torch_threads_kept():
        su = T.setup(args)
        assert len(su.ds) == 24 and su.ds.layer_ids == LAYER_IDS
        counts = torch.load(data / "token_freq.pt", weights_only=True)
        assert int(su.freq.sum()) == sum(counts.values())  # the vocabulary came from token_freq.pt
        before = T.evaluate(su.draft, su.target, su.ds)
        T.train(args)
        after = T.evaluate(T.load_exported(tmp_path / "draft"), su.target, su.ds)
    assert before["acc"][0] < 0.05
    assert after["acc"][0] > 0.25
    assert after["loss"][0] < 0.5 * before["loss"][0]
