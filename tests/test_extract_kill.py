"""SIGKILL in the middle of an extraction, then a relaunch: the output equals an uninterrupted run's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")
pytest.importorskip("transformers", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

from extract_helpers import REPO, build_test_model, cli_env, output_files, reference_run, run_cli, run_main

N = 24  # samples


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run's output."""
    base = tmp_path_factory.getbasetemp()
    model = build_test_model(base)
    files = reference_run(base, model, N, 4)
    assert sum(n.startswith("hs_") for n in files) == N
    return model, files


def test_sigkill_while_writing_a_sample_then_relaunch(tmp_path, reference, capsys):
    model, want = reference
    args = ["--model", str(model), "--out", str(tmp_path), "--max-samples", str(N), "--batch-size", "4"]
    # The process SIGKILLs itself half-way through writing its 11th sample (sample 10): samples 8
    # and 9 of chunk [8..11] are finished, 10 is a partial temporary file, 11 is not started.
    r = run_cli(args, EAGLE3_FAULT_SIGKILL_AFTER="10")
    assert r.returncode == -signal.SIGKILL, r.stdout
    assert "extract progress: 8/24 samples" in r.stdout and "extract done" not in r.stdout
    done = sorted(p.name for p in tmp_path.glob("hs_*.safetensors"))
    assert len(done) == 10
    temps = list(tmp_path.glob(".hs_10.safetensors.tmp-*"))
    assert len(temps) == 1
    before = {n: (tmp_path / n).stat().st_mtime_ns for n in done}

    rc, stdout = run_main(capsys, args)  # the relaunch (in this process: it is not killed)
    assert rc == 0, stdout
    assert "extract resume: removed 1 unfinished temporary file(s)" in stdout
    assert "extract resume: 10/24 samples already finished" in stdout
    assert not list(tmp_path.glob(".*.tmp-*"))
    assert output_files(tmp_path) == want
    assert {n: (tmp_path / n).stat().st_mtime_ns for n in done} == before  # never rewritten


def test_external_sigkill_between_batches_then_relaunch(tmp_path, reference, capsys):
    model, want = reference
    args = [sys.executable, "-m", "eagle3.extract", "--model", str(model), "--out", str(tmp_path),
            "--max-samples", str(N), "--batch-size", "4"]
    p = subprocess.Popen(args, cwd=REPO, env=cli_env(EAGLE3_FAULT_BATCH_DELAY_S="0.5"), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = []
    deadline = time.monotonic() + 60
    try:
        for line in p.stdout:
            seen.append(line.rstrip("\n"))
            if line.startswith("extract progress: 8/24"):
                os.kill(p.pid, signal.SIGKILL)
                break
            assert time.monotonic() < deadline, seen
    finally:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGKILL)
        p.wait(timeout=30)
        p.stdout.close()
    assert p.returncode == -signal.SIGKILL, seen
    n_done = len(list(tmp_path.glob("hs_*.safetensors")))
    assert 8 <= n_done < N

    rc, stdout = run_main(capsys, args[3:])
    assert rc == 0, stdout
    assert f"extract resume: {n_done}/24 samples already finished" in stdout
    assert output_files(tmp_path) == want


def test_a_second_process_on_the_same_output_is_refused(tmp_path, reference):
    import fcntl

    model, _ = reference
    tmp_path.mkdir(exist_ok=True)
    fd = os.open(tmp_path / ".extract.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"4242\n")
        r = run_cli(["--model", str(model), "--out", str(tmp_path), "--max-samples", "2"])
    finally:
        os.close(fd)
    assert r.returncode == 1
    assert "OutputBusy: another extract process (pid 4242) is writing to" in r.stdout
    assert "Traceback (most recent call last)" in r.stdout
