"""Shards and relaunches of vLLM-backend extraction on one --out never touch each other's staged files.

Each shard runs in its own process on the fake engine (tests/fakes/extract_on_fake_vllm.py): request ids
unique per process and ``generate`` holding a staged batch until its gate opens, as vLLM 0.23 does while the
batch's last request computes. The staged files of a live shard are what a start-up cleanup must not delete.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")
pytest.importorskip("transformers", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

from extract_helpers import REPO, build_test_model, cli_env, ended_pid, output_files

RUNNER = REPO / "tests" / "fakes" / "extract_on_fake_vllm.py"
N, BATCH = 16, 4  # two shards of two batches each


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_test_model(tmp_path_factory.getbasetemp())


def args(model: Path, out: Path, *extra: str) -> list[str]:
    return ["--model", str(model), "--out", str(out), "--max-samples", str(N), "--batch-size", str(BATCH),
            "--file-timeout", "2", *extra]


def start(cmd: list[str], log: Path, gate: Path | None = None) -> subprocess.Popen[bytes]:
    env = cli_env(**({"FAKE_VLLM_GATE": str(gate)} if gate else {}))
    with log.open("wb") as f:
        return subprocess.Popen([sys.executable, str(RUNNER), *cmd], cwd=REPO, env=env, stdout=f,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(what: str, log: Path, proc: subprocess.Popen[bytes], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while what not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} before {what!r}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {what!r} in {timeout}s:\n{log.read_text()}"
        time.sleep(0.05)


def hidden(out: Path) -> dict[str, bytes]:
    return {k: v for k, v in output_files(out).items() if k.startswith("hs_")}


@pytest.fixture(scope="module")
def lone(model_dir, tmp_path_factory) -> dict[str, bytes]:
    """Every sample as one uninterrupted, unsharded launch writes it."""
    out = tmp_path_factory.mktemp("lone")
    log = out.parent / "lone.log"
    p = start(args(model_dir, out), log)
    assert p.wait(timeout=300) == 0, log.read_text()
    files = hidden(out)
    assert len(files) == N
    return files


def test_two_shards_at_once_one_relaunched_mid_extraction_keep_every_sample(tmp_path, model_dir, lone):
    out = tmp_path / "out"
    gate0, never = tmp_path / "open-0", tmp_path / "never"
    log0, log1, log1b = tmp_path / "shard0.log", tmp_path / "shard1.log", tmp_path / "shard1-relaunch.log"
    # Shard 0 stages its first batch and holds it there (its batch's last request "still computing").
    s0 = start(args(model_dir, out, "--shard", "0", "--num-shards", "2"), log0, gate0)
    s1 = s1b = None
    try:
        wait_for("fake vllm: batch staged", log0, s0)
        # Shard 1 starts meanwhile, stages its own first batch, and is SIGKILLed there, mid-extraction.
        s1 = start(args(model_dir, out, "--shard", "1", "--num-shards", "2"), log1, never)
        wait_for("fake vllm: batch staged", log1, s1)
        os.killpg(s1.pid, signal.SIGKILL)
        assert s1.wait(timeout=30) == -signal.SIGKILL
        # Its relaunch runs to the end while shard 0 still holds its staged batch.
        s1b = start(args(model_dir, out, "--shard", "1", "--num-shards", "2"), log1b)
        assert s1b.wait(timeout=300) == 0, log1b.read_text()
        assert s0.poll() is None, log0.read_text()  # the two overlapped: shard 0 was mid-batch throughout
        gate0.touch()
        assert s0.wait(timeout=300) == 0, log0.read_text()
    finally:
        for p in (s0, s1, s1b):
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=30)
    text0, text1b = log0.read_text(), log1b.read_text()
    assert "failed" not in text0 and "failed" not in text1b, (text0, text1b)
    assert "extract done: 8 samples" in text0 and "extract done: 8 samples" in text1b
    assert hidden(out) == lone  # every sample of both shards, byte for byte
    # Nothing is left staged: the killed launch's files were its relaunch's to remove, the others their own.
    assert [p for p in (out / ".staging").rglob("*") if p.is_file()] == []


def test_a_sweep_takes_only_what_no_live_process_owns(tmp_path):
    """A launch's directory is swept only once its owner is gone; flat files of older releases only when no
    other extract process holds its lock on --out."""
    from eagle3 import staging

    root = tmp_path / ".staging"
    live = staging.Staging.claim(root, 0, 2)
    (live.path / "0-aaaaaaaa.safetensors").write_bytes(b"staged, not yet taken")
    # A launch killed by SIGKILL: its process (here a child) held the lock, the kernel dropped it at exit.
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path; from eagle3 import staging;"
            "s = staging.Staging.claim(Path(sys.argv[2]), 1, 2); (s.path / '3-bbbbbbbb.safetensors').write_bytes(b'x');"
            "print(s.path, flush=True); import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    r = subprocess.run([sys.executable, "-c", code, str(REPO / "jobs"), str(root)], capture_output=True, text=True)
    assert r.returncode == -signal.SIGKILL
    dead = Path(r.stdout.strip())
    assert dead.is_dir() and dead != live.path
    (root / "5.safetensors").write_bytes(b"older release's flat staging")
    other_lock = tmp_path / ".extract.shard-1-of-2.lock"
    import fcntl

    fd = os.open(other_lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # another extract process on --out is alive
    try:
        assert staging.sweep(root, [other_lock]) == 1  # the dead launch's directory only
    finally:
        os.close(fd)
    assert not dead.exists() and (live.path / "0-aaaaaaaa.safetensors").exists() and (root / "5.safetensors").exists()
    assert staging.sweep(root, [other_lock]) == 1  # nobody else alive now: the flat file goes
    assert sorted(p.name for p in root.iterdir()) == [live.path.name]
    live.release(remove=True)
    assert list(root.iterdir()) == []


@pytest.mark.timeout(600)
def test_random_sigkills_of_shards_and_relaunches_keep_every_sample_once_and_identical(tmp_path):
    """The stateful random run of tests/perf/bench_shard_kills.py, small: three shards at once, each launch
    SIGKILLed at a random moment (start-up, staging, placing) and relaunched until all end; then gather."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_shard_kills", REPO / "tests" / "perf" / "bench_shard_kills.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_shard_kills", bench)  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    model, prompts = bench.target(tmp_path, 36)
    lone = tmp_path / "lone"
    r = subprocess.run([sys.executable, str(RUNNER), *bench.args_of(model, prompts, lone)], cwd=REPO,
                       env=bench.env(None, 0), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    o = bench.run(7, model, prompts, 36, 3, bench.files(lone), tmp_path, None, step_s=0.1, kill_p=1.0,
                  max_kill_s=4.0, max_kills=4)
    assert o.problems == [] and o.identical, o
    assert o.kills >= 1 and o.self_deaths == 0 and o.failed_requests == 0, o


def test_a_shards_start_up_leaves_the_temporaries_of_a_running_shard_and_removes_a_dead_ones(tmp_path, model_dir):
    """Shards on one --out start at different times. A start-up that removed every ``.NAME.tmp-PID`` deleted a
    running shard's file between its write and its rename, and that shard died on its own file (seen in the
    random-kill run: ``FileNotFoundError`` on ``token_freq.shard-1-of-3.safetensors``). A shard on another host
    of a shared filesystem has a pid that says nothing here: its temporaries are left until a day old."""
    from eagle3 import _io

    out = tmp_path / "out"
    out.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])  # a shard mid-write
    gone = ended_pid()  # a shard killed mid-write
    here = _io.temp_tag().split("@", 1)[1]
    try:
        alive = [out / f".token_freq.shard-0-of-2.safetensors.tmp-{writer.pid}@{here}",
                 out / f".hs_1.safetensors.tmp-{writer.pid}",  # an older release's name
                 out / f".hs_2.safetensors.tmp-{gone}@another-host"]  # another host's shard, written just now
        dead = [out / f".token_freq.shard-0-of-2.safetensors.tmp-{gone}@{here}", out / f".hs_3.safetensors.tmp-{gone}",
                out / f".hs_5.safetensors.tmp-{gone}@another-host"]
        for p in alive + dead:
            p.write_bytes(b"half written")
        two_days_ago = time.time() - 2 * 24 * 3600
        os.utime(dead[-1], (two_days_ago, two_days_ago))  # another host's, untouched for two days
        (out / f".dataset.tmp-{writer.pid}@{here}").mkdir()
        (out / f".dataset.tmp-{gone}@{here}").mkdir()
        log = tmp_path / "shard1.log"
        s1 = start(args(model_dir, out, "--shard", "1", "--num-shards", "2"), log)
        assert s1.wait(timeout=300) == 0, log.read_text()
        assert all(p.read_bytes() == b"half written" for p in alive)
        assert (out / f".dataset.tmp-{writer.pid}@{here}").is_dir()
        assert not any(p.exists() for p in dead) and not (out / f".dataset.tmp-{gone}@{here}").exists()
        assert not [p for p in out.glob(f".*.tmp-{s1.pid}*")]  # its own were renamed into place
    finally:
        writer.kill()
        writer.wait(timeout=30)
