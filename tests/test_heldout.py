"""eagle3.heldout: acceptance of a trained draft estimated on extracted samples before serving (chained
per-position acceptance of the greedy proposals, implied mean acceptance length, draft vocabulary
coverage)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from train_helpers import THIRD_PARTY_WARNINGS, make_fixture, torch_threads_kept, train_args

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.filterwarnings(w) for w in THIRD_PARTY_WARNINGS]

from eagle3 import heldout
from eagle3 import train as T


@pytest.fixture(scope="module", autouse=True)
def _threads():
    with torch_threads_kept():
        yield


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_fixture(tmp_path_factory.getbasetemp() / "heldout-fixture")


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("draft")
    args = T.parse_args(train_args(data, out, "--max-steps", "100", "--log-every", "50", "--save-every", "1000"))
    su = T.setup(args)
    untrained = heldout.estimate(su.draft, su.target, su.ds)
    T.train(args)
    return out, su, untrained


def test_a_proposal_counts_only_when_every_earlier_one_matched():
    hits = [torch.tensor([[1, 1, 0, 1]], dtype=torch.bool), torch.tensor([[0, 1, 1]], dtype=torch.bool),
            torch.tensor([[1, 1]], dtype=torch.bool)]
    valid = torch.tensor([[1, 1]], dtype=torch.bool)
    # anchor 0: hit, miss, (hit) -> 1 then stops; anchor 1: hit, hit, hit -> 3.
    assert heldout.chain_counts(hits, valid) == ([2, 1, 1], 2)
    assert heldout.chain_counts(hits, torch.tensor([[0, 1]], dtype=torch.bool)) == ([1, 1, 1], 1)


def test_the_estimate_of_a_trained_draft(trained, data, capsys):
    out, su, untrained = trained
    assert heldout.main(["--draft", str(out), "--data", str(data), "--device", "cpu"]) == 0
    line = capsys.readouterr().out
    assert line.startswith(f"heldout: {len(su.ds)} samples, ") and line.count("\n") == 1
    est = json.loads((out / "heldout.json").read_text())
    acc = est["accept"]
    assert acc == sorted(acc, reverse=True) and len(acc) == 3
    assert est["mean_acceptance_length"] == pytest.approx(1 + sum(acc))
    assert est["rate"][1] == pytest.approx(acc[1] / acc[0])
    # Training on these samples lifts the first proposal's acceptance well above the untrained draft's.
    assert untrained.accept[0] < 0.05 and acc[0] > 0.3
    # Coverage: the masked tokens of the samples inside the draft's vocabulary, counted here directly.
    draft = T.load_exported(out)
    inside = total = 0
    for i in range(len(su.ds)):
        b = su.ds.batch([i])
        inside += int((draft.t2d[b["ids"]] & b["mask"]).sum())
        total += int(b["mask"].sum())
    assert est["coverage"] == pytest.approx(inside / total)
    assert 0.0 <= est["data_agreement"] <= 1.0


@pytest.mark.parametrize("case", ["steps", "draft"])
def test_refusals_are_one_line_exit_78(trained, data, tmp_path, capsys, case):
    out, _, _ = trained
    argv = ["--draft", str(out if case == "steps" else tmp_path / "none"), "--data", str(data), "--device", "cpu"]
    if case == "steps":
        argv += ["--steps", "0"]
    assert heldout.main(argv) == 78
    text = capsys.readouterr().out
    assert text.count("\n") == 1 and text.startswith("heldout error: ")
