"""A full disk stops the extraction cleanly (one line, exit code 75, no partial file); a relaunch finishes."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")
pytest.importorskip("transformers", reason="the jobs' dependencies (jobs/requirements.txt) are not installed")

from extract_helpers import build_test_model, output_files, reference_run, run_main

# eagle3 lives in jobs/: importable only once extract_helpers has put jobs/ on the path.
# isort: split
from eagle3 import _io

N = 24
DISK_FULL = re.compile(r"^extract error: disk full writing (\S+): free space and relaunch; finished samples are kept$",
                       re.M)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    base = tmp_path_factory.getbasetemp()
    model = build_test_model(base)
    return model, reference_run(base, model, N, 4)


def check_stopped_cleanly(out: Path, rc: int, stdout: str) -> str:
    assert rc == 75, stdout
    m = DISK_FULL.search(stdout)
    assert m, stdout
    assert len(DISK_FULL.findall(stdout)) == 1 and stdout.splitlines()[-1] == m.group(0)
    assert not list(out.glob(".*.tmp-*")), "a partial temporary file was left"
    for p in out.glob("hs_*.safetensors"):
        assert _io.sample_file_ok(p), f"{p.name} is not complete"
    return m.group(1)


@pytest.fixture
def small_tmpfs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_full_disk_then_free_space_and_relaunch(small_tmpfs, reference, capsys):
    model, want = reference
    out = small_tmpfs / "out"
    args = ["--model", model, "--out", out, "--max-samples", N, "--batch-size", 4]
    rc, stdout = run_main(capsys, args)
    path = check_stopped_cleanly(out, rc, stdout)
    n_done = len(list(out.glob("hs_*.safetensors")))
    assert 0 < n_done < N, stdout
    assert Path(path).parent == out

    # Free space (grow the filesystem) and relaunch: the run finishes, equal to an uninterrupted one.
    subprocess.run(["mount", "-o", "remount,size=8m", str(small_tmpfs)], check=True)
    rc, stdout = run_main(capsys, args)
    assert rc == 0, stdout
    assert f"extract resume: {n_done}/{N} samples already finished" in stdout
    assert output_files(out) == want


def test_injected_enospc_hook(tmp_path, reference, capsys, monkeypatch):
    """The same through the test hook, where no tmpfs can be mounted."""
    model, want = reference
    args = ["--model", model, "--out", tmp_path, "--max-samples", N, "--batch-size", 4]
    monkeypatch.setenv("EAGLE3_FAULT_ENOSPC_AFTER", "5")
    monkeypatch.setattr(_io, "_samples_written", 0)  # the hook counts this process's sample writes
    rc, stdout = run_main(capsys, args)
    monkeypatch.delenv("EAGLE3_FAULT_ENOSPC_AFTER")
    path = check_stopped_cleanly(tmp_path, rc, stdout)
    assert path == str(tmp_path / "hs_5.safetensors")
    assert sorted(p.name for p in tmp_path.glob("hs_*")) == sorted(f"hs_{i}.safetensors" for i in range(5))
    rc, stdout = run_main(capsys, args)
    assert rc == 0, stdout
    assert output_files(tmp_path) == want
