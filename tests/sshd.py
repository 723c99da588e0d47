"""A real OpenSSH server on loopback for the SSH host's tests and benchmarks.

`SshServer` runs `/usr/sbin/sshd -D -e -f <config>` on 127.0.0.1 and a free port, with its
own host key, a generated client key as the only authorized key, a known_hosts file that
holds the host key and an ssh config naming all of it.  Nothing under the user's real
`~/.ssh` is read or written: the client side is configured only through the
`SUPERVISE_SSH_*` variables of `env()`.

`sshd_server` is a session-scoped pytest fixture around it.  Without sshd installed the
tests that use it FAIL (CI installs openssh-server); they never skip.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Self

import psutil
import pytest

SSHD = "/usr/sbin/sshd"
INSTALL_HINT = "apt-get update && apt-get install -y openssh-server"


class SshServer:
    def __init__(self, root: Path | None = None, *, max_sessions: int = 64, extra_config: str = "") -> None:
        self.max_sessions = max_sessions
        self.extra_config = extra_config  # more sshd_config lines (SetEnv for a Slurm login node)
        self.root = Path(root or tempfile.mkdtemp(prefix="sv-sshd-", dir="/tmp"))
        self._own_root = root is None
        self.user = getpass.getuser()
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None
        self.host_key = self.root / "host_ed25519"
        self.client_key = self.root / "client_ed25519"
        self.known_hosts = self.root / "known_hosts"
        self.ssh_config = self.root / "ssh_config"
        self.log_file = self.root / "sshd.log"

    # -- lifecycle --------------------------------------------------------------------

    def start(self) -> Self:
        if not os.access(SSHD, os.X_OK):
            raise RuntimeError(f"{SSHD} is not installed: the SSH tests need a real OpenSSH server ({INSTALL_HINT})")
        self.root.mkdir(parents=True, exist_ok=True)
        for key in (self.host_key, self.client_key):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "supervise-test", "-f", str(key)],
                               check=True, capture_output=True)
        (self.root / "authorized_keys").write_bytes(self.client_key.with_suffix(".pub").read_bytes())
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
        self.port = _free_port()
        config = self.root / "sshd_config"
        config.write_text(
            f"Port {self.port}\n"
            "ListenAddress 127.0.0.1\n"
            f"HostKey {self.host_key}\n"
            f"PidFile {self.root / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {self.root / 'authorized_keys'}\n"
            "PermitRootLogin yes\n"
            "PubkeyAuthentication yes\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "PrintMotd no\n"
            f"MaxSessions {self.max_sessions}\n"
            "MaxStartups 100:30:200\n"
            "LogLevel VERBOSE\n"
            + self.extra_config
        )
        host_pub = self.host_key.with_suffix(".pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {host_pub[0]} {host_pub[1]}\n")
        self.ssh_config.write_text(
            "Host *\n"
            f"  IdentityFile {self.client_key}\n"
            f"  UserKnownHostsFile {self.known_hosts}\n"
        )
        self._log = open(self.log_file, "ab")  # noqa: SIM115 - closed in stop()
        self._listen()
        return self

    def _listen(self) -> None:
        config = self.root / "sshd_config"
        self.proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=self._log, stderr=self._log,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 10
        while not _accepts(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"sshd did not start on port {self.port}: {self.log_text()[-2000:]}")
            time.sleep(0.02)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.drop_connections()
        if self.proc is not None:
            self._log.close()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what clients need --------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        """The variables that point SshHost (in this process or a daemon) at this server."""
        return {
            "SUPERVISE_SSH_CONFIG": str(self.ssh_config),
            "SUPERVISE_SSH_KNOWN_HOSTS": str(self.known_hosts),
            "SUPERVISE_SSH_KEY": str(self.client_key),
        }

    def log_text(self) -> str:
        return self.log_file.read_text(errors="replace") if self.log_file.exists() else ""

    # -- breaking things ------------------------------------------------------------------

    def connection_processes(self) -> list[psutil.Process]:
        """The per-connection sshd processes (not the listener, not the sessions' commands)."""
        if self.proc is None:
            return []
        try:
            listener = psutil.Process(self.proc.pid)
            children = listener.children(recursive=True)
        except psutil.Error:
            return []
        found = []
        for child in children:
            with contextlib.suppress(psutil.Error):
                if child.name() == "sshd" or (child.cmdline()[:1] and child.cmdline()[0].startswith("sshd")):
                    found.append(child)
        return found

    def go_away(self) -> None:
        """The box drops off the network, as its clients see it: every connection is cut and a new
        one is refused, until ``come_back``."""
        procs = self.connection_processes()  # found while the listener, their parent, still runs
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(timeout=5)
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=5)

    def come_back(self) -> None:
        """The box answers again, on the same port with the same keys."""
        self._listen()

    def drop_connections(self) -> int:
        """SIGKILL every per-connection sshd: each client sees its connection die at once."""
        procs = self.connection_processes()
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGKILL)
        psutil.wait_procs(procs, timeout=5)
        return len(procs)


def without_python3(root: Path) -> str:
    """sshd_config lines for a box whose PATH has no python3: every other program of the
    system's bin directories, linked into one, and a HOME with no rc files (a user's .bashrc
    may put a python3 back on the PATH, pyenv's shims for one)."""
    bin_dir, home = root / "bin", root / "home"
    bin_dir.mkdir(parents=True, exist_ok=True)
    home.mkdir(exist_ok=True)
    for directory in ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin"):
        for entry in sorted(Path(directory).iterdir()) if Path(directory).is_dir() else []:
            link = bin_dir / entry.name
            if not entry.name.startswith("python") and not link.exists() and not link.is_symlink():
                link.symlink_to(entry)
    return f"SetEnv PATH={bin_dir} HOME={home}\n"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.settimeout(2)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


@pytest.fixture(scope="session")
def sshd_server() -> Iterator[SshServer]:
    if not os.access(SSHD, os.X_OK):
        pytest.fail(f"{SSHD} not found: the SSH tests need a real OpenSSH server; install it with `{INSTALL_HINT}`",
                    pytrace=False)
    server = SshServer()
    server.start()
    try:
        yield server
    finally:
        server.stop()
