"""EAGLE-3 draft training (jobs/eagle3/train.py): checkpoints, kill and relaunch, corrupt checkpoints,
a non-finite loss, and a relaunch with other settings."""

from __future__ import annotations

import re
import signal
from pathlib import Path

import pytest
from train_helpers import (
    THIRD_PARTY_WARNINGS,
    final_state,
    make_fixture,
    popen_train,
    run_train,
    torch_threads_kept,
    train_args,
)

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.filterwarnings(w) for w in THIRD_PARTY_WARNINGS]

from eagle3 import train as T
from eagle3._ckpt import Checkpoints

STEPS = 16  # 4 epochs of the 24-sample fixture at batch size 4 is 24 steps; 16 ends mid-epoch


@pytest.fixture(scope="module", autouse=True)
def _threads():
    with torch_threads_kept():
        yield


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return make_fixture(tmp_path_factory.getbasetemp() / "train-fixture")


def _assert_same_weights(a: Path, b: Path) -> None:
    sa, sb = final_state(a), final_state(b)
    assert sa["step"] == sb["step"] == STEPS
    assert sa["model"].keys() == sb["model"].keys()
    for k in sa["model"]:
        assert torch.equal(sa["model"][k], sb["model"][k]), k  # fp32 on the CPU: bit for bit
    for k, v in sa["optimizer"]["state"].items():
        assert torch.equal(v["exp_avg"], sb["optimizer"]["state"][k]["exp_avg"])
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_sigkill_then_relaunch_gives_the_uninterrupted_weights(data, tmp_path):
    args = ["--max-steps", str(STEPS), "--save-every", "4", "--seed", "7"]
    ref = run_train(train_args(data, tmp_path / "ref", *args))
    assert ref.returncode == 0, ref.stdout
    assert f"train done: {STEPS} steps" in ref.stdout.splitlines()

    out = tmp_path / "killed"
    proc = popen_train(train_args(data, out, *args), EAGLE3_TRAIN_STEP_DELAY_S="0.15")
    seen = []
    try:
        for line in proc.stdout:  # kill two steps after the step-8 checkpoint: steps 9-10 are lost
            seen.append(line.rstrip("\n"))
            if line.startswith(f"train step 10/{STEPS} "):
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, "\n".join(seen)
    assert f"train checkpoint saved: step 8 path {out / 'checkpoints' / 'step_00000008'}" in seen
    assert not (out / "model.safetensors").exists()

    again = run_train(train_args(data, out, *args))
    assert again.returncode == 0, again.stdout
    lines = again.stdout.splitlines()
    assert f"train resumed from step 8 ({out / 'checkpoints' / 'step_00000008'})" in lines
    assert lines[-1] == f"train done: {STEPS} steps"
    assert next(ln.split()[2] for ln in lines if ln.startswith("train step ")) == f"9/{STEPS}"
    # the resumed run repeats the killed run's step 9 and 10 exactly
    step10 = next(ln for ln in seen if ln.startswith(f"train step 10/{STEPS} "))
    step10_again = next(ln for ln in lines if ln.startswith(f"train step 10/{STEPS} "))
    assert re.sub(r"tok/s=\S+ ", "", step10) == re.sub(r"tok/s=\S+ ", "", step10_again)
    _assert_same_weights(tmp_path / "ref", out)
    kept = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert kept == ["step_00000008", "step_00000012", "step_00000016"]  # --keep 3


@pytest.mark.parametrize("damage", ["checksum", "truncated", "no-marker"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_previous(data, tmp_path, capsys, damage):
    out = tmp_path / "out"
    args = T.parse_args(train_args(data, out, "--max-steps", "8", "--save-every", "4", "--log-every", "100"))
    T.train(args)
    newest = out / "checkpoints" / "step_00000008"
    state = newest / "state.pt"
    if damage == "checksum":
        raw = bytearray(state.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        state.write_bytes(bytes(raw))
    elif damage == "truncated":
        state.write_bytes(state.read_bytes()[:1000])
    else:
        (newest / "COMPLETE").unlink()
    (out / "checkpoints" / ".tmp-step_00000012-999").mkdir()  # a save killed half-way
    capsys.readouterr()

    T.train(T.parse_args(train_args(data, out, "--max-steps", "8", "--save-every", "4", "--log-every", "100")))
    lines = capsys.readouterr().out.splitlines()
    unusable = [ln for ln in lines if "unusable" in ln]
    assert len(unusable) == 1
    assert unusable[0].startswith(f"train checkpoint {newest} is unusable (")
    assert unusable[0].endswith("); falling back to the previous one")
    assert f"train resumed from step 4 ({out / 'checkpoints' / 'step_00000004'})" in lines
    assert lines[-1] == "train done: 8 steps"
    assert not (out / "checkpoints" / ".tmp-step_00000012-999").exists()
    assert Checkpoints(out / "checkpoints").problem(newest) is None  # step 8 was written again, complete
    assert (out / "checkpoints" / "unusable-step_00000008").is_dir()  # the damaged one, set aside


def test_non_finite_loss_stops_with_floating_point_error(data, tmp_path):
    res = run_train(train_args(data, tmp_path / "out", "--max-steps", "6"), EAGLE3_TRAIN_INJECT_NAN_AT="3")
    assert res.returncode != 0
    lines = res.stdout.splitlines()
    assert "train loss is not finite at step 3" in lines
    assert "train step 2/6" in " ".join(lines) and "train step 3/6" not in " ".join(lines)
    assert "Traceback (most recent call last):" in res.stdout
    assert lines[-1].startswith("FloatingPointError: ")


def test_relaunch_with_other_settings_is_refused(data, tmp_path):
    out = tmp_path / "out"
    T.train(T.parse_args(train_args(data, out, "--max-steps", "2")))
    with pytest.raises(T.OutputMismatch, match=r"differs in: .*lr"):
        T.train(T.parse_args(train_args(data, out, "--max-steps", "2", "--lr", "1e-2")))
