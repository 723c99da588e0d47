"""A real single-node Slurm cluster on this machine for the Slurm host's tests and benchmark.

`SlurmCluster` writes a `slurm.conf` for this host alone (no GPUs, no accounting database),
makes a munge key, and runs `munged`, `slurmctld` and `slurmd` in the foreground under a
temporary directory, on free ports, with their own munge socket: nothing under /etc is read
or written.  Clients find it through `SLURM_CONF` (see `env()`).  They run as root here (the
CI container's user), as Debian 12's slurm-wlm allows with SlurmUser=root.

`slurm_cluster` is a session-scoped pytest fixture around it.  Without slurm-wlm and munge
installed the tests that use it FAIL (CI installs them); they never skip.
"""

from __future__ import annotations

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

import pytest

INSTALL_HINT = "apt-get update && apt-get install -y slurm-wlm munge"
_DAEMONS = ("/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd")


class SlurmCluster:
    def __init__(self, root: Path | None = None, *, cpus: int | None = None) -> None:
        self.root = Path(root or tempfile.mkdtemp(prefix="sv-slurm-", dir="/tmp"))
        self._own_root = root is None
        self.node = socket.gethostname().split(".")[0]
        self.cpus = cpus or os.cpu_count() or 1
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge.socket"
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> Self:
        missing = [d for d in _DAEMONS if not os.access(d, os.X_OK)]
        if missing:
            raise RuntimeError(f"{', '.join(missing)} not installed: the Slurm tests need them ({INSTALL_HINT})")
        for sub in ("state", "spool", "munge"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.conf.write_text(self._config())
        self._run("munged", ["/usr/sbin/munged", "--foreground", "--force", f"--key-file={key}",
                             f"--socket={self.socket}", f"--pid-file={self.root / 'munge' / 'munged.pid'}",
                             f"--seed-file={self.root / 'munge' / 'seed'}", f"--log-file={self.root / 'munged.log'}"])
        self._wait(self.socket.exists, "munged did not create its socket", "munged.log")
        # -i: ignore state files a previous cluster in this directory left behind.
        self._run("slurmctld", ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)])
        self._run("slurmd", ["/usr/sbin/slurmd", "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(self._node_idle, "the node did not become idle", "slurmctld.log", timeout_s=30)
        return self

    def _config(self) -> str:
        return "\n".join([
            "ClusterName=supervise-test",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.socket}",
            f"StateSaveLocation={self.root / 'state'}",
            f"SlurmdSpoolDir={self.root / 'spool'}",
            f"SlurmctldPidFile={self.root / 'slurmctld.pid'}",
            f"SlurmdPidFile={self.root / 'slurmd.pid'}",
            f"SlurmctldLogFile={self.root / 'slurmctld.log'}",
            f"SlurmdLogFile={self.root / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            # Processes are tracked by their parentage (a container may have no writable cgroups);
            # a job's `setsid` does not take it out of its job.
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "MpiDefault=none",
            "SwitchType=switch/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "SchedulerType=sched/builtin",
            "ReturnToService=2",
            "KillWait=2",  # seconds between Slurm's own TERM and KILL (time limit, cancel)
            "MinJobAge=600",  # ended jobs stay visible to squeue/scontrol for the whole session
            "InactiveLimit=0",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
            "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
            "",
        ])

    def _run(self, name: str, argv: list[str]) -> None:
        log = open(self.root / f"{name}.out", "ab")  # noqa: SIM115 - the child keeps its own copy
        try:
            self._procs.append(subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                                env={**os.environ, **self.env()}, start_new_session=True))
        finally:
            log.close()

    def _wait(self, ready: object, what: str, log_name: str, timeout_s: float = 10.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():  # type: ignore[operator]
            dead = [p.args[0] for p in self._procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"{what} (exited: {dead}): {self.log_tail(log_name)}")
            time.sleep(0.1)

    def _node_idle(self) -> bool:
        out = self.command(["sinfo", "-h", "-N", "-o", "%T"], check=False)
        return out.strip().startswith("idle")

    def stop(self) -> None:
        self.command(["scancel", "--user=root"], check=False)
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._procs.clear()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- what clients need --------------------------------------------------------------

    def env(self) -> dict[str, str]:
        """The variables that point Slurm's commands (in this process or a daemon) at this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def command(self, argv: list[str], *, check: bool = True) -> str:
        result = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **self.env()}, timeout=30)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed: {result.stderr.strip()}")
        return result.stdout

    def job_field(self, job_id: str, key: str) -> str:
        """One field of `scontrol show job` (JobState, Reason, Restarts, ...)."""
        for item in self.command(["scontrol", "-o", "show", "job", job_id]).split():
            if item.startswith(f"{key}="):
                return item.split("=", 1)[1]
        return ""

    def log_tail(self, name: str, limit: int = 2000) -> str:
        text = ""
        for candidate in (self.root / name, self.root / f"{Path(name).stem}.out"):
            if candidate.exists():
                text += candidate.read_text(errors="replace")[-limit:]
        return text


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    missing = [d for d in _DAEMONS if not os.access(d, os.X_OK)]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: the Slurm tests need a real Slurm; install it with "
                    f"`{INSTALL_HINT}`", pytrace=False)
    cluster = SlurmCluster()
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
