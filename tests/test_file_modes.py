"""The state directory is private: 0700, its files 0600, unreadable to any other user."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from conftest import DaemonProcess, wait_until
from e2e_jobs import job_state, supervise

WRITES_A_FILE = """\
import sys
open(sys.argv[1], "w").write("out")
print("wrote it", flush=True)
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_is_private_and_jobs_keep_their_umask(home: Path, daemon_env: dict[str, str], make_job,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # What an older daemon left: a 0755 state directory, 0644 files.
    os.chmod(home, 0o755)
    old_log = home / "logs" / "old" / "attempt-1.log"
    old_log.parent.mkdir(parents=True)
    old_log.write_text("token=secret\n")
    os.chmod(old_log, 0o644)
    os.chmod(old_log.parent, 0o755)
    out = home / "job-output.txt"
    spec = make_job("modes", WRITES_A_FILE, params=f', "{out}"')
    monkeypatch.setenv("SUPERVISE_HOME", str(home))
    daemon = DaemonProcess(home, daemon_env)
    daemon.start()
    try:
        client = daemon.client()
        client.start(str(spec), {})
        wait_until(lambda: job_state(client, "modes") == "done")
        log = Path(client.attempts("modes").attempts[0].log_path)
        for directory in (home, home / "logs", log.parent, old_log.parent):
            assert mode(directory) == 0o700, directory
        for path in (home / "supervise.db", home / "supervise.db-wal", home / "supervise.db-shm", log, old_log):
            assert mode(path) == 0o600, path
        # The job itself runs under the umask the daemon was started with, not the daemon's 077.
        umask = os.umask(0)
        os.umask(umask)
        assert mode(out) == 0o666 & ~umask
        if os.geteuid() == 0 and shutil.which("setpriv"):
            for path in (home / "supervise.db", home / "supervise.db-wal", log):
                denied = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "cat", str(path)],
                                        capture_output=True, timeout=20, check=False)
                assert denied.returncode != 0 and b"Permission denied" in denied.stderr, path
    finally:
        daemon.close()


def test_doctor_reports_each_state_file_mode_and_warns_on_an_open_one(daemon: DaemonProcess,
                                                                       daemon_env: dict[str, str]) -> None:
    def line(out: str, name: str) -> str:  # doctor's row for one check: "STATUS   NAME   what it found"
        return next(row for row in out.splitlines() if row.split(None, 1)[1:] and row.split(None, 1)[1].startswith(name))

    out = supervise(daemon_env, "doctor", check=False).stdout
    assert "is mode 0700" in line(out, "state dir"), out
    assert "is mode 0600" in line(out, "store"), out
    assert line(out, "containment").split()[0] in ("ok", "warn")
    daemon.paths.db.chmod(0o644)
    try:
        warned = line(supervise(daemon_env, "doctor", check=False).stdout, "store")
    finally:
        daemon.paths.db.chmod(0o600)
    assert warned.startswith("warn") and "mode 0644" in warned and f"chmod go-rwx {daemon.paths.db}" in warned, warned
