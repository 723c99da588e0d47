"""Extraction and training at once on a bounded disk (jobs/eagle3/budget.py): `eagle3.extract --disk-budget`
beside `eagle3.train --order stream`, against an unbounded extraction then `--order index` on the same data.

Real processes, the tiny test model on the CPU; the weights are compared bit for bit (fp32 on the CPU)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")
pytest.importorskip("transformers", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

from extract_helpers import REPO, build_test_model, cli_env
from train_helpers import THIRD_PARTY_WARNINGS

pytestmark = [pytest.mark.filterwarnings(w) for w in THIRD_PARTY_WARNINGS]

from eagle3 import budget

N = 24  # samples of the shipped prompt set
EXTRACT = ["--max-samples", str(N), "--batch-size", "2", "--layer-ids", "1,2,3,4", "--device", "cpu"]
TRAIN = ["--device", "cpu", "--epochs", "1", "--batch-size", "2", "--draft-vocab", "96", "--lr", "3e-3",
         "--threads", "1", "--log-every", "1", "--save-every", "1000", "--seed", "5"]


class Proc:
    """A job process whose output lines are collected by a thread (so waiting on a line has a timeout)."""

    def __init__(self, module: str, args: list[str], **env: str):
        self.p = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=cli_env(**env),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                  start_new_session=True)
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        assert self.p.stdout is not None
        with self.p.stdout:
            for line in self.p.stdout:
                self.lines.append(line.rstrip("\n"))

    def wait_line(self, prefix: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            hit = next((ln for ln in self.lines if ln.startswith(prefix)), None)
            if hit is not None:
                return hit
            assert self.p.poll() is None or self._t.is_alive(), "\n".join(self.lines)
            time.sleep(0.05)
        raise AssertionError(f"no line {prefix!r} in {timeout}s:\n" + "\n".join(self.lines))

    def kill(self) -> None:
        os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait(timeout=30)
        self._t.join(timeout=30)

    def finish(self, timeout: float = 300) -> int:
        rc = self.p.wait(timeout=timeout)
        self._t.join(timeout=30)
        return rc


def _until(cond, proc: Proc, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "\n".join(proc.lines)
        assert proc.p.poll() is None, "\n".join(proc.lines)
        time.sleep(0.02)


def _sample_bytes(out: Path) -> int:
    n = 0
    for p in out.glob("hs_*.safetensors"):
        try:
            n += p.stat().st_size
        except FileNotFoundError:  # released between the listing and the stat
            pass
    return n


def _weights(out: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(out / "model.safetensors"))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The unbounded run: the whole extraction, then one epoch in index order. (model, weights, data bytes)."""
    base = tmp_path_factory.getbasetemp()
    model = build_test_model(base)
    data, draft = base / "budget-ref-extract", base / "budget-ref-train"
    ex = Proc("eagle3.extract", ["--model", str(model), "--out", str(data), *EXTRACT])
    assert ex.finish() == 0, "\n".join(ex.lines)
    total = _sample_bytes(data)
    tr = Proc("eagle3.train", ["--data", str(data), "--out", str(draft), "--order", "index", *TRAIN])
    assert tr.finish() == 0, "\n".join(tr.lines)
    assert len(list(data.glob("hs_*.safetensors"))) == N  # --order index keeps every file
    return model, _weights(draft), total


def _probe(pack: str, probe_id: str):
    import re
    import tomllib

    probes = tomllib.loads((REPO / "probes" / f"{pack}.toml").read_text())["probes"]
    return re.compile(next(p["regex"] for p in probes if p["id"] == probe_id))


def _same(a: dict, b: dict) -> None:
    import torch

    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.slow
@pytest.mark.timeout(480)  # two job processes at once, each a model load: under a minute alone, more on 2 shared vCPUs
def test_a_budget_of_a_tenth_gives_the_unbounded_weights(reference, tmp_path):
    model, want, total = reference
    data, draft = tmp_path / "extract", tmp_path / "train"
    limit = total // 10
    tr = Proc("eagle3.train", ["--data", str(data), "--out", str(draft), "--order", "stream", *TRAIN])
    ex = Proc("eagle3.extract", ["--model", str(model), "--out", str(data), "--disk-budget", str(limit), *EXTRACT])
    peak = 0
    while ex.p.poll() is None or tr.p.poll() is None:  # the folder's sample bytes, sampled as both run
        peak = max(peak, _sample_bytes(data) if data.is_dir() else 0)
        time.sleep(0.01)
    assert ex.finish() == 0, "\n".join(ex.lines)
    assert tr.finish() == 0, "\n".join(tr.lines)
    _same(_weights(draft), want)
    # The lines supervise's probes read (probes/extract.toml, probes/train.toml) are the ones the jobs print.
    paused = next(ln for ln in ex.lines if ln.startswith("extract paused: "))
    released = next(ln for ln in tr.lines if ln.startswith("train released: "))
    assert _probe("extract", "paused").search(paused)["budget"] == str(limit)
    assert _probe("train", "released").search(released)["last"] == released.split("..")[1].split()[0]
    # Past the budget only where training waits on a sample of the next batch: one training batch plus one
    # extraction batch (4 samples, a sixth of this set) at most.
    assert 0 < peak <= max(limit, total * 4 // N + total // 10), (peak, limit, total)
    assert not list(data.glob("hs_*.safetensors"))  # every sample consumed and released
    ledger = budget.Ledger.read(data)
    assert (ledger.through, ledger.waiting_for) == (N, None)
    assert ledger.released_bytes == total  # the same files, byte for byte the same size, each once


@pytest.mark.slow
@pytest.mark.timeout(480)  # two job processes at once, each a model load: under a minute alone, more on 2 shared vCPUs
def test_sigkill_of_the_trainer_mid_epoch_and_of_the_paused_extractor_lose_nothing(reference, tmp_path):
    model, want, total = reference
    data, draft = tmp_path / "extract", tmp_path / "train"
    ex_args = ["--model", str(model), "--out", str(data), "--disk-budget", str(total // 10), *EXTRACT]
    tr_args = ["--data", str(data), "--out", str(draft), "--order", "stream", *TRAIN]
    tr = Proc("eagle3.train", tr_args, EAGLE3_TRAIN_STEP_DELAY_S="0.2")
    ex = Proc("eagle3.extract", ex_args)
    released = tr.lines.index(tr.wait_line("train released: "))  # a checkpoint was made and released
    _until(lambda: any(ln.startswith("train step ") for ln in tr.lines[released:]), tr)  # a step past it
    tr.kill()
    assert tr.p.returncode == -signal.SIGKILL
    # With nobody consuming, extraction fills its budget and pauses; killed there.
    _until(lambda: (data / budget.PAUSED).exists() and ex.lines[-1].startswith("extract paused: "), ex)
    ex.kill()
    through = budget.Ledger.read(data).through
    assert 0 < through < N

    tr2 = Proc("eagle3.train", tr_args)
    ex2 = Proc("eagle3.extract", ex_args)
    assert ex2.finish() == 0, "\n".join(ex2.lines)
    assert tr2.finish() == 0, "\n".join(tr2.lines)
    assert any(ln.startswith("train resumed from step ") for ln in tr2.lines), tr2.lines
    resumed = next(ln for ln in ex2.lines if ln.startswith("extract resume: "))
    assert int(resumed.split()[2].split("/")[0]) >= through  # consumed samples count as finished
    _same(_weights(draft), want)
    assert budget.Ledger.read(data).through == N and not list(data.glob("hs_*.safetensors"))


# ------------------------------------------------------------------------------------------ bad values

@pytest.mark.parametrize(("text", "n"), [("2GiB", 2 * 2**30), ("500MB", 500 * 10**6), ("1.5G", 3 * 2**29),
                                         ("1000000", 10**6), (" 64 KiB ", 64 * 1024), ("7b", 7)])
def test_sizes(text, n):
    assert budget.parse_size(text) == n


def _refused(capsys, main, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2  # usage
    err = capsys.readouterr().err.strip().splitlines()
    return err[-1]


@pytest.mark.parametrize(("value", "says"), [
    ("2XB", "--disk-budget '2XB': give a size in bytes, e.g. 2GiB, 500MB or 1000000"),
    ("-5MB", "give a size in bytes"),
    ("0", "the budget must be at least one byte"),
    ("lots", "give a size in bytes"),
])
def test_bad_budgets_are_refused_in_one_line(capsys, tmp_path, value, says):
    from eagle3 import extract

    line = _refused(capsys, extract.parse_args, ["--out", str(tmp_path), f"--disk-budget={value}"])
    assert says in line
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(("extra", "says"), [
    (["--num-shards", "2", "--shard", "0"], "--disk-budget works with one extraction process"),
    (["--format", "speculators"], "--disk-budget writes --format supervise only"),
    (["--verify", "2"], "--disk-budget cannot --verify"),
])
def test_budgets_that_cannot_hold_are_refused(capsys, tmp_path, extra, says):
    from eagle3 import extract

    assert says in _refused(capsys, extract.parse_args, ["--out", str(tmp_path), "--disk-budget", "1GiB", *extra])


def test_streaming_more_than_one_epoch_is_refused(capsys, tmp_path):
    from eagle3 import train

    line = _refused(capsys, train.parse_args, ["--data", str(tmp_path), "--out", str(tmp_path / "o"),
                                               "--order", "stream", "--epochs", "2"])
    assert "--order stream trains exactly one epoch" in line
    line = _refused(capsys, train.parse_args, ["--data", str(tmp_path), "--out", str(tmp_path / "o"),
                                               "--order", "stream", "--max-steps", "3"])
    assert "give --epochs 1 and no --max-steps" in line
    line = _refused(capsys, train.parse_args, ["--data", str(tmp_path), "--out", str(tmp_path / "o"),
                                               "--order", "random"])
    assert "invalid choice: 'random'" in line


def test_an_empty_budget_is_none(tmp_path):
    from eagle3 import extract

    assert extract.parse_args(["--out", str(tmp_path), "--disk-budget", ""]).disk_budget is None
    assert extract.parse_args(["--out", str(tmp_path), "--disk-budget", "2GiB"]).disk_budget == 2 * 2**30


# ------------------------------------------------------------------------------------------ the ledger

def test_release_records_first_then_deletes_and_a_sweep_finishes_a_killed_release(tmp_path):
    paths = [tmp_path / f"hs_{i}.safetensors" for i in range(6)]
    for i, p in enumerate(paths):
        p.write_bytes(b"x" * (10 + i))
    led = budget.release(tmp_path, 3, lambda i: paths[i])
    assert (led.through, led.released_bytes) == (3, 10 + 11 + 12)
    assert [p.exists() for p in paths] == [False] * 3 + [True] * 3
    assert budget.release(tmp_path, 2, lambda i: paths[i]) == led  # never backwards
    # A launch killed after writing the ledger, before deleting: the next launch's sweep deletes.
    budget.Ledger(5, None, led.released_bytes + 13 + 14).write(tmp_path)
    assert budget.sweep(tmp_path, lambda i: paths[i]).through == 5
    assert [p.exists() for p in paths] == [False] * 5 + [True]
    budget.want(tmp_path, 5)
    assert budget.Ledger.read(tmp_path).waiting_for == 5
    budget.Ledger.path(tmp_path).write_text("{not json")
    with pytest.raises(RuntimeError, match=r"consumed\.json is unreadable"):
        budget.Ledger.read(tmp_path)


# ------------------------------------------------------------------------------------------ the pipeline

def test_the_shipped_budget_pipeline_runs_extract_and_train_at_once_on_one_directory():
    from supervisor.spec.pipeline import load_pipeline, resolve

    path = REPO / "jobs" / "eagle3-budget.toml"
    resolved = resolve(load_pipeline(path), path, {"disk_budget": "3GiB"}).steps
    steps = {s.step: s.spec.argv(1) for s in resolved}
    assert list(steps) == ["extract", "train"]
    assert [s.after_steps for s in resolved] == [(), ()]  # neither waits for the other to end
    ex, tr = steps["extract"], steps["train"]
    assert ex[ex.index("--disk-budget") + 1] == "3GiB"
    assert tr[tr.index("--data") + 1] == ex[ex.index("--out") + 1]
    assert (tr[tr.index("--order") + 1], tr[tr.index("--epochs") + 1]) == ("stream", "1")
    # The single jobs keep their behaviour: no budget, shuffled epochs.
    plain = REPO / "jobs" / "eagle3.toml"
    argvs = {s.step: s.spec.argv(1) for s in resolve(load_pipeline(plain), plain, {}).steps}
    for name, flag, value in (("extract", "--disk-budget", ""), ("train", "--order", "shuffled")):
        assert argvs[name][argvs[name].index(flag) + 1] == value


@pytest.mark.slow
@pytest.mark.timeout(600)  # two model loads and an extraction beside the training: about a minute on 2 busy cores
def test_the_budget_pipeline_under_the_daemon_survives_a_daemon_sigkill(daemon, home: Path) -> None:
    from conftest import wait_until

    from supervisor.core.events import JobState

    prompts = home / "prompts-16.jsonl"
    prompts.write_text("".join((REPO / "jobs" / "data" / "prompts.jsonl").read_text().splitlines(keepends=True)[:16]))
    client = daemon.client()
    client.start_pipeline(str(REPO / "jobs" / "eagle3-budget.toml"),
                          {"disk_budget": "150kB", "extract.prompts": str(prompts)})
    data = home / "out" / "eagle3-budget" / "extract"
    wait_until(lambda: budget.Ledger.read(data).through > 0, timeout=400)  # training has released samples
    daemon.kill()  # SIGKILL: both jobs go on unwatched
    daemon.start()
    client = daemon.client()

    def ended():
        status = client.status("eagle3-budget").pipelines[0]
        assert status.state not in (JobState.FAILED, JobState.CANCELLED), status
        return status if status.state is JobState.DONE else None

    status = wait_until(ended, timeout=400)
    assert [s.state for s in status.steps] == [JobState.DONE, JobState.DONE]
    ledger = budget.Ledger.read(data)
    assert ledger.through == 16 and not list(data.glob("hs_*.safetensors"))
    assert (home / "out" / "eagle3-budget" / "train" / "model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.timeout(300)  # the job's relaunches with their backoff: about 20 s
def test_a_bad_budget_under_the_daemon_fails_the_job_in_one_line_and_the_daemon_lives_on(daemon, home: Path) -> None:
    from conftest import wait_until

    from supervisor.core.events import JobState

    client = daemon.client()
    client.start(str(REPO / "jobs" / "extract.toml"), {"disk_budget": "lots", "out": str(home / "out" / "x")})

    def ended():
        st = client.status("extract").jobs[0]
        return st if st.state in (JobState.FAILED, JobState.STOPPED, JobState.DONE) else None

    st = wait_until(ended, timeout=240)
    assert st.state is JobState.FAILED
    attempts = client.attempts("extract").attempts
    text = Path(attempts[-1].log_path).read_text()
    assert "--disk-budget 'lots': give a size in bytes, e.g. 2GiB, 500MB or 1000000" in text
    assert all(a.exit_code == 2 for a in attempts), [a.exit_code for a in attempts]
    assert not (home / "out" / "x").exists()  # nothing written
    assert client.ping() is not None  # the daemon lives on


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "1e9"])
def test_bad_wait_report_intervals_are_refused_in_one_line(capsys, tmp_path, value):
    from eagle3 import extract, train

    says = f"--wait-report-s {value!r}: give seconds between 0.1 and 3600 (default 15)"
    assert says in _refused(capsys, extract.parse_args, ["--out", str(tmp_path), "--wait-report-s", value])
    assert says in _refused(capsys, train.parse_args, ["--data", str(tmp_path), "--out", str(tmp_path / "o"),
                                                       "--order", "stream", "--epochs", "1", "--wait-report-s", value])
    assert not list(tmp_path.iterdir())  # nothing written
    assert extract.parse_args(["--out", str(tmp_path), "--wait-report-s", "0.5"]).wait_report_s == 0.5
