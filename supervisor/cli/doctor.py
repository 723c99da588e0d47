"""`supervise doctor [--host H]`: can this box run supervised jobs?  One line per check.

With ``--host ssh://[user@]box[:port]`` it checks, in order: the SSH connection, the host
key, the login, then on the box itself what the SSH host's scripts need (``/bin/sh``,
``setsid``, ``/proc``, GNU ``grep -z``, ``awk``, a fractional ``sleep``), that the host's
agent starts on the box's ``python3`` (or ``SUPERVISE_SSH_PYTHON``), ``nvidia-smi`` and the
free space under the remote log root.  Without a host it
runs the same shell checks on this machine, against the local log root, and looks at NVML.

Each line is ``ok`` or ``MISSING`` (or ``warn``), the check, and what was found or exactly
what to do.  The exit status is 1 when a required check is MISSING, else 0; 69 (host unavailable),
in one line, when the host does not answer at all.
"""

from __future__ import annotations

import asyncio
import stat
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.core.config import Paths
from supervisor.core.errors import ConnectionLost, HostError, SuperviseError
from supervisor.core.host_url import LOCAL_HOST
from supervisor.hosts import DOCTOR_SCRIPT, after_mark, parse_keys, script

if TYPE_CHECKING:
    from supervisor.hosts.ssh.host import SshHost

LOW_DISK_KIB = 1024 * 1024  # below 1 GiB free under the log root: a warning


@dataclass(frozen=True)
class Check:
    status: str  # "ok", "MISSING", "warn", "skipped"
    name: str
    detail: str
    required: bool = True
    unreachable: bool = False  # the host did not answer at all: nothing else could be checked

    def line(self) -> str:
        return f"{self.status:<8} {self.name:<11} {self.detail}"


def doctor_command(host: str | None) -> int:
    if host in (None, "", LOCAL_HOST):
        checks = [*_local_checks(), *_quarantine_checks(None)]
    else:
        checks = asyncio.run(_remote_checks(host))
        if not any(c.unreachable for c in checks):
            checks += _quarantine_checks(host)
    if any(c.unreachable for c in checks):
        # One line and the table's "host unavailable", as any verb that cannot reach a host says it.
        print(next(c for c in checks if c.unreachable).line(), flush=True)
        return HostError.exit_code
    for check in checks:
        print(check.line(), flush=True)
    failed = [c for c in checks if c.status == "MISSING" and c.required]
    if failed:
        print(f"doctor: {len(failed)} required check(s) MISSING: {', '.join(c.name for c in failed)}")
        return 1
    optional = [c for c in checks if c.status == "MISSING"]
    print("doctor: ready" + (f" (optional, MISSING: {', '.join(c.name for c in optional)})" if optional else ""))
    return 0


# -- remote --------------------------------------------------------------------------------

async def _remote_checks(url: str) -> list[Check]:
    from supervisor.hosts.ssh.host import SshHost

    checks: list[Check] = []
    try:
        host = SshHost(url)
    except SuperviseError as exc:
        return [Check("MISSING", "host", str(exc))]
    where = host.target.display
    try:
        try:
            # One try: a host that does not answer is said at once, not after 16 s of retry lines
            # (a job's connection retries; a check of whether the box answers now does not).
            await host.connection(deadline=time.monotonic())
        except SuperviseError as exc:
            return checks + _connection_failure(host, exc)
        checks.append(Check("ok", "ssh", f"connected to {where}"))
        checks.append(Check("ok", "host key", "matches known_hosts"))
        checks.append(Check("ok", "login", f"logged in as {host.target.user or 'the default user'}"))
        try:
            root = await host.log_root()
            _, out, _ = await host.run_script(DOCTOR_SCRIPT, root, host.nvidia_smi, host.pyspy, host.kernel_log,
                                              host.mux.python)
        except SuperviseError as exc:
            return [*checks, Check("MISSING", "/bin/sh", f"cannot run a script on {where}: {exc}")]
        values = parse_keys(out)
        checks += [*_shell_checks(values, where, remote=True), await _agent_check(host, values, where),
                   _remote_pyspy_check(values, where)]
        checks += _remote_kernel_log_check(values, where, host.kernel_log)
    finally:
        await host.close()
    return checks


async def _agent_check(host: SshHost, v: dict[str, str], where: str) -> Check:
    """Whether the host's agent (which follows the logs and watches the exits) starts on the box:
    the refusal's own line where it does not (no job can run there then)."""
    try:
        async with asyncio.timeout(30):
            await host.mux.ready()
    except TimeoutError:
        return Check("MISSING", "python3", f"the supervisor's agent did not start on {where} within 30s")
    except SuperviseError as exc:
        return Check("MISSING", "python3", str(exc))
    found = v.get("python3") or host.mux.python
    return Check("ok", "python3", f"{found} ({host.mux.python}) runs the agent that follows the logs there")


def _connection_failure(host: SshHost, exc: SuperviseError) -> list[Check]:
    text = str(exc)
    target = host.target
    if isinstance(exc, ConnectionLost):
        return [Check("MISSING", "ssh", f"{text}: check the host name and port, and that sshd runs there "
                                        f"(`ssh -p {target.port or 22} {target.display.split(':')[0]}` should work)",
                      unreachable=True)]
    if text.startswith("host key of"):
        return [Check("ok", "ssh", f"{target.where} answers"), Check("MISSING", "host key", text)]
    if text.startswith("SSH login"):
        return [Check("ok", "ssh", f"{target.where} answers"), Check("ok", "host key", "matches known_hosts"),
                Check("MISSING", "login", text)]
    return [Check("MISSING", "ssh", text)]


# -- local ---------------------------------------------------------------------------------

def _local_checks() -> list[Check]:
    from supervisor.core.config import DaemonSettings, default_paths
    from supervisor.gpu.kernel_xids import KmsgReader
    from supervisor.gpu.nvml import NvmlSampler

    root = str(default_paths().logs)
    try:
        proc = subprocess.run(["/bin/sh", "-s"], input=script(DOCTOR_SCRIPT, root, "nvidia-smi"),
                              capture_output=True, timeout=60, check=False)
    except OSError as exc:
        return [Check("MISSING", "/bin/sh", f"cannot run /bin/sh: {exc}")]
    values = parse_keys(after_mark(proc.stdout) or b"")
    checks = _shell_checks(values, "this machine", remote=False)
    sampler = NvmlSampler(kernel_log=KmsgReader(DaemonSettings().kernel_log))
    sample = sampler.sample()
    xids = sampler.xid_source()
    sampler.close()
    if sample.available:
        checks.append(Check("ok", "NVML", f"{len(sample.devices)} GPU(s) visible"))
        checks.append(Check("ok" if xids.readable else "MISSING", "Xid errors", xids.text, required=False))
    else:
        checks.append(Check("MISSING", "NVML", f"{sample.reason}: GPU memory will not be watched "
                                               "(install the NVIDIA driver and nvidia-ml-py)", required=False))
    return [*checks, *_containment_checks(), _pyspy_check(), _reader_check(), *_mode_checks(default_paths()),
            _web_check(default_paths())]


def _reader_check() -> Check:
    """Which engine reads the logs here (the daemon reads every job's log on this machine)."""
    from supervisor.probes import ProbeEngine, load_packs

    try:
        reader = ProbeEngine(load_packs()).reader
    except SuperviseError as exc:
        return Check("MISSING", "log reader", f"the built-in probe packs do not load: {exc}")
    if reader.startswith("re2 (prefilter off: the hyperscan package"):
        return Check("warn", "log reader", f"{reader}: correct, only slower (`pip install hyperscan` beside "
                                           "supervise, x86-64 Linux)", required=False)
    return Check("ok", "log reader", reader, required=False)


def _pyspy_check() -> Check:
    from supervisor.hosts.stacks import find_pyspy

    found = find_pyspy()
    if found is None:
        return Check("MISSING", "py-spy", "not found: a hung job's stacks are not dumped before its kill "
                                         "(`pip install py-spy` beside supervise, or set SUPERVISE_PYSPY)", required=False)
    return Check("ok", "py-spy", f"{found}: stacks are dumped before a kill and by `supervise stack`", required=False)


def _remote_pyspy_check(v: dict[str, str], where: str) -> Check:
    found = v.get("pyspy", "")
    if not found:
        return Check("MISSING", "py-spy", f"not found on {where}: a hung job's stacks are not dumped there before its "
                                         "kill (`pip install --user py-spy` on the box, or set SUPERVISE_SSH_PYSPY="
                                         "/path/to/py-spy for the daemon)", required=False)
    return Check("ok", "py-spy", f"{found} ({v.get('pyspy_version') or '?'}): stacks are dumped on {where} "
                                 "before a kill and by `supervise stack`", required=False)


def _remote_kernel_log_check(v: dict[str, str], where: str, command: str) -> list[Check]:
    if not command:
        return []
    if v.get("kernel_log") == "ok":
        return [Check("ok", "Xid errors", f"read from `{command}` on {where} at each GPU sample", required=False)]
    return [Check("MISSING", "Xid errors", f"`{command}` is refused on {where} (kernel.dmesg_restrict?): GPU Xid "
                                          "errors are not seen there; ECC, pending pages and slowdowns still are "
                                          "(let the user read the kernel log, or set SUPERVISE_SSH_KERNEL_LOG to a "
                                          "command that can, e.g. `sudo -n dmesg`)", required=False)]


def _quarantine_checks(host: str | None) -> list[Check]:
    """The GPUs and hosts the daemon keeps jobs away from (all of them, or ``host``'s), each with
    its expiry: a warning each, never a failure (they expire, or `--clear` lifts them)."""
    from supervisor.cli.client import Client
    from supervisor.cli.quarantine import quarantine_lines
    from supervisor.core.config import default_paths

    try:
        client = Client(default_paths(), timeout_s=10)
    except SuperviseError as exc:  # a state directory no daemon could listen in (a socket path too long)
        return [Check("skipped", "quarantine", f"no daemon to ask: {exc}", required=False)]
    try:
        held = client.quarantine().quarantined
    except SuperviseError:
        return [Check("skipped", "quarantine", "the daemon is not running", required=False)]
    finally:
        client.close()
    mine = [q for q in held if host is None or q.host == host]
    if not mine:
        return [Check("ok", "quarantine", "no GPU or host quarantined", required=False)]
    return [Check("warn", "quarantine", f"{line}; `supervise quarantine --clear {q.place}` lifts it", required=False)
            for q, line in zip(mine, quarantine_lines(mine), strict=True)]


def _web_check(paths: Paths) -> Check:
    """Whether the page `supervise web` asked for is served (its port may have been taken while
    the daemon was down); only the running daemon knows."""
    from supervisor.cli.client import Client

    client = Client(paths, timeout_s=10)
    try:
        note = client.status().web_note
    except SuperviseError:
        return Check("skipped", "web page", "the daemon is not running", required=False)
    finally:
        client.close()
    if note:
        return Check("warn", "web page", note, required=False)
    return Check("ok", "web page", "served as asked (or off)", required=False)


def _containment_checks() -> list[Check]:
    """How attempts are contained, and whether a spec's [limits] can be enforced (the setting cgroup_root
    as the daemon reads it)."""
    from supervisor.core.config import load_settings
    from supervisor.core.resource_limits import Controller
    from supervisor.hosts.local.cgroup import ContainmentKind, detect

    try:
        configured = load_settings().settings.cgroup_root
    except SuperviseError:
        configured = ""  # a bad config file is the config check's to report
    found = detect(base=Path(configured) if configured else None)
    status = "ok" if found.kind is ContainmentKind.CGROUP else "warn"
    containment = Check(status, "containment", f"{found.kind.value} ({found.reason})", required=False)
    if found.controllers == frozenset(Controller):
        limits = Check("ok", "limits", "[limits] enforced: memory, cpu and pids controllers for each attempt",
                       required=False)
    else:
        limits = Check("warn", "limits", f"a spec with [limits] is refused here ({found.limits_note}); see the "
                                         "setting cgroup_root", required=False)
    return [containment, limits]


def _mode_checks(paths: Paths) -> list[Check]:
    """The state directory and what it holds (specs' env, every job's log) are this user's only."""
    checks = []
    for name, path in (("state dir", paths.state_dir), ("store", paths.db), ("daemon log", paths.daemon_log),
                       ("job logs", paths.logs)):
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            checks.append(Check("ok", name, f"{path}: not made yet", required=False))
            continue
        except OSError as exc:
            checks.append(Check("warn", name, f"{path}: cannot stat: {exc.strerror}", required=False))
            continue
        if mode & 0o077:
            checks.append(Check("warn", name, f"{path} is mode {mode:04o}: other users can read it; "
                                              f"`chmod go-rwx {path}`", required=False))
        else:
            checks.append(Check("ok", name, f"{path} is mode {mode:04o}", required=False))
    return checks


# -- what the shell reported ---------------------------------------------------------------

def _shell_checks(v: dict[str, str], where: str, *, remote: bool) -> list[Check]:
    checks = [Check("ok", "/bin/sh", f"{v.get('sh') or '/bin/sh'} runs scripts")]
    checks.append(Check("ok", "setsid", v["setsid"]) if v.get("setsid") else
                  Check("MISSING", "setsid", f"not found on {where}: install util-linux "
                                             "(`apt-get install util-linux` or `dnf install util-linux`)"))
    checks.append(Check("ok", "/proc", "readable") if v.get("proc") == "ok" else
                  Check("MISSING", "/proc", f"/proc is not readable on {where}: a Linux box with /proc mounted is needed"))
    checks.append(Check("ok", "grep -z", "GNU grep") if v.get("grep") == "ok" else
                  Check("MISSING", "grep -z", f"`grep -z` does not work on {where}: install GNU grep", required=remote))
    checks.append(Check("ok", "awk", "works") if v.get("awk") == "ok" else
                  Check("MISSING", "awk", f"awk not found on {where}: install mawk or gawk", required=remote))
    checks.append(Check("ok", "sleep", "takes fractions of a second") if v.get("sleep") == "ok" else
                  Check("MISSING", "sleep", f"`sleep 0.01` fails on {where}: install coreutils", required=remote))
    if remote:
        checks.append(_nvidia_check(v, where))
    checks.append(_disk_check(v, where))
    return checks


def _nvidia_check(v: dict[str, str], where: str) -> Check:
    path = v.get("nvidia_smi", "")
    if not path:
        return Check("MISSING", "nvidia-smi", f"not found on the PATH of a non-interactive SSH session on {where}: "
                                              "install the NVIDIA driver utilities, or set SUPERVISE_SSH_NVIDIA_SMI="
                                              "/path/to/nvidia-smi for the daemon (GPU memory is not watched without it)",
                     required=False)
    if v.get("nvidia_smi_rc") != "0":
        return Check("MISSING", "nvidia-smi", f"{path} fails: {v.get('nvidia_smi_first', '')}: check the driver "
                                              "(`nvidia-smi` by hand on the box)", required=False)
    return Check("ok", "nvidia-smi", f"{path}: {v.get('nvidia_smi_gpus', '0')} GPU(s)")


def _disk_check(v: dict[str, str], where: str) -> Check:
    root, existing = v.get("root", "?"), v.get("root_existing", "?")
    free = v.get("df", "")
    if v.get("root_writable") != "yes":
        return Check("MISSING", "log root", f"{existing} (for {root}) is not writable on {where}: fix its "
                                            "permissions or set SUPERVISE_SSH_LOG_ROOT / SUPERVISE_HOME")
    if not free.isdigit():
        return Check("warn", "log root", f"{root}: free space unknown (df gave {free or 'nothing'})", required=False)
    kib = int(free)
    text = f"{root}: {kib / 1024 / 1024:.1f} GiB free"
    if kib < LOW_DISK_KIB:
        return Check("MISSING", "log root", f"{text}: less than 1 GiB; free some space on {existing}")
    return Check("ok", "log root", text)


if __name__ == "__main__":
    sys.exit(doctor_command(sys.argv[1] if len(sys.argv) > 1 else None))
