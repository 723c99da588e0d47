"""The wheel, as a new user gets it: built from this checkout, installed into a fresh venv outside it,
and used from there with the working directory outside the repository.

A non-editable install once shipped neither probes/ nor jobs/: `probe` on a crash log said "failure:
none" and exited 0, and `start extract` found no spec.

The wheel itself is installed with `--no-deps`; its dependencies come from the interpreter running the
tests, through a .pth file in the fresh venv (offline and fast; the wheel's own files are what is under
test).  The extract job runs under this interpreter too (`--python`): it has torch and transformers
(jobs/requirements.txt), which the supervise venv never has, as in "Two Python environments".
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from conftest import REPO, _kill_leftover_jobs, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]  # a wheel build and a venv in the first test

CRASH_LOG = REPO / "tests" / "data" / "corpus" / "full-logs" / "03-unsloth-vllm-rocm-lora-profile-crash.log"
# Not part of a distribution: left out of the copy the wheel is built from.
_NOT_SHIPPED = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.pyc",
                                      "out", "tests", "shared", ".state", ".vllm")


def _run(argv: list[str | Path], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, check=False, **kwargs)  # type: ignore[call-overload]


def _build_isolation() -> list[str]:
    # setuptools builds wheels by itself from 70.1 on; an older one (a fresh 3.11 venv has 65) needs
    # pip's isolated build, which downloads setuptools from the index.
    try:
        major, minor = (int(part) for part in metadata.version("setuptools").split(".")[:2])
    except (metadata.PackageNotFoundError, ValueError):
        return []
    return ["--no-build-isolation"] if (major, minor) >= (70, 1) else []


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy, so that build/ and *.egg-info never land in the checkout (a stale build/lib
    # would also end up in the next wheel).
    src = tmp_path_factory.mktemp("src") / "supervise"
    shutil.copytree(REPO, src, ignore=_NOT_SHIPPED)
    dist = tmp_path_factory.mktemp("dist")
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *_build_isolation(), "-w", dist, src],
                 timeout=300)
    assert built.returncode == 0, built.stdout + built.stderr
    [path] = dist.glob("supervise-*.whl")
    return path


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    made = _run([sys.executable, "-m", "venv", "--without-pip", root], timeout=120)
    assert made.returncode == 0, made.stderr
    site = Path(_run([root / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     timeout=60).stdout.strip())
    ours = sysconfig.get_paths()
    (site / "_supervise_test_deps.pth").write_text(f"{ours['purelib']}\n{ours['platlib']}\n")
    installed = _run([sys.executable, "-m", "pip", "--python", root / "bin" / "python", "install", "--no-deps",
                      "--no-index", wheel], timeout=300)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return root


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A working directory with no jobs/ or probes/ in reach."""
    path = tmp_path / "elsewhere"
    path.mkdir()
    return path


@pytest.fixture
def user_home() -> Iterator[Path]:
    # Short: the daemon's Unix socket path must stay under ~100 bytes.
    home = Path(tempfile.mkdtemp(prefix="svw-", dir="/tmp"))
    yield home
    _kill_leftover_jobs(home)
    _stop_daemon(home)
    shutil.rmtree(home, ignore_errors=True)


def _stop_daemon(home: Path) -> None:
    pid_file = home / "daemon.pid"
    if not pid_file.exists():
        return
    pid = int(pid_file.read_text().split()[0])
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    wait_until(lambda: not _alive(pid), timeout=20, interval=0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SUPERVISE_JOBS_PATH",
                                                            "SUPERVISE_PROBE_PATH", "VIRTUAL_ENV")}
    env["SUPERVISE_HOME"] = str(home)
    return env


def test_the_wheel_holds_every_source_file_probe_pack_and_job_file(wheel: Path) -> None:
    # The package list in pyproject.toml is written out by hand (find cannot add mapped directories).
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {str(p.relative_to(REPO)) for p in (REPO / "supervisor").rglob("*.py")} | {"supervisor/py.typed"}
    expected |= {f"supervisor/_builtin/probes/{p.name}" for p in (REPO / "probes").glob("*.toml")}
    expected |= {f"supervisor/_builtin/jobs/{p.relative_to(REPO / 'jobs')}" for p in (REPO / "jobs").rglob("*")
                 if p.is_file() and "__pycache__" not in p.parts}
    assert expected - names == set()
    assert "supervisor/_builtin/jobs/eagle3/extract.py" in names and "supervisor/_builtin/probes/python.toml" in names


def test_the_installed_package_is_the_wheel_not_the_checkout(venv: Path, outside: Path, user_home: Path) -> None:
    code = "import supervisor.resources as r; print(r.probes_dir()); print(r.jobs_dir())"
    shown = _run([venv / "bin" / "python", "-c", code], cwd=outside, env=_env(user_home), timeout=60)
    assert shown.returncode == 0, shown.stderr
    probes, jobs = (Path(line) for line in shown.stdout.splitlines())
    assert probes.is_relative_to(venv) and (probes / "python.toml").is_file()
    assert jobs.is_relative_to(venv) and (jobs / "eagle3" / "extract.py").is_file()


def test_probe_from_the_wheel_finds_the_crash(venv: Path, outside: Path, user_home: Path) -> None:
    result = _run([venv / "bin" / "supervise", "probe", CRASH_LOG], cwd=outside, env=_env(user_home), timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr  # a crash, as grep signals a match
    # The labels accept both: the last phase line is 'Model loading took', the traceback's frames say kv_cache_profile.
    assert re.match(r"outcome: crashed    last phase: (weights_loaded|kv_cache_profile)\n", result.stdout), result.stdout
    assert "failure: runtime_error" in result.stdout


@pytest.mark.timeout(600)  # the whole default extraction: about a minute on 2 idle cores, more on busy ones
def test_start_extract_from_the_wheel_runs_the_embedded_job(venv: Path, outside: Path, user_home: Path) -> None:
    start = [venv / "bin" / "supervise", "start", "extract", "--follow", "--python", sys.executable]
    result = _run(start, cwd=outside, env=_env(user_home), timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"phase +done\b", result.stdout), result.stdout  # one phase name per phase line
    manifest = json.loads((user_home / "out" / "extract" / "manifest.json").read_text())
    assert (manifest["status"], manifest["num_samples"]) == ("complete", 64)
    events = _run([venv / "bin" / "supervise", "events", "extract", "--json"], cwd=outside, env=_env(user_home),
                  timeout=60)
    # The job's state changes are events too (the first says it is starting): the launch is the first of its kind.
    launched = next(e for line in events.stdout.splitlines() if (e := json.loads(line))["kind"] == "launched")
    argv = launched["data"]["argv"]
    assert Path(argv[argv.index("--prompts") + 1]).is_relative_to(venv)  # the job's data came with the wheel
