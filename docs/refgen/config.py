"""reference/config.md: the daemon's settings (supervisor/core/config.py's DaemonSettings) and every
SUPERVISE_* environment variable the package reads or sets."""

from __future__ import annotations

import re
from pathlib import Path

from .source import cell, doc
from .spec import _bounds, default_of, type_name

PACKAGE = Path(__file__).resolve().parents[2] / "supervisor"
_VAR = re.compile(r"""["'](SUPERVISE_[A-Z0-9_]+)["']""")

# What each variable is for.  The generator stops when the package names one not described here,
# or when one described here is no longer named anywhere in the package.
VARIABLES = {
    "SUPERVISE_HOME": "the state directory (default `$XDG_STATE_HOME/supervise`, else `~/.local/state/supervise`)",
    "SUPERVISE_CONFIG": "the config file (default `$SUPERVISE_HOME/config.toml`)",
    "SUPERVISE_JOBS_PATH": "directories (`:`-separated) where `supervise start NAME` looks for NAME.toml, before `./jobs` and "
                           "the built-in jobs",
    "SUPERVISE_PROBE_PATH": "directories (`:`-separated) of probe packs found by name; an earlier one shadows a "
                            "built-in pack of the same name",
    "SUPERVISE_PREFILTER": "`off`: the probes read logs with RE2 alone, without the Hyperscan prefilter (the events "
                           "are the same, only slower); `supervise doctor` says which engine reads",
    "SUPERVISE_PYSPY": "the py-spy used for stack dumps (default: the PATH, then beside the daemon's interpreter)",
    "SUPERVISE_NVIDIA_SMI": "the nvidia-smi whose `-q` report is kept at a hang verdict on this machine (default: the PATH's)",
    "SUPERVISE_ATTEMPT": "set by supervise in every attempt's environment: the tag its processes are found by",
    "SUPERVISE_CGROUP": "set by supervise for the launch wrapper: the cgroup a local attempt enters",
    "SUPERVISE_LIMITS": "set by supervise for the launch wrapper: the attempt's cgroup holds its spec's `[limits]`, "
                        "so the command never runs outside it",
    "SUPERVISE_SSH_CONFIG": "the OpenSSH config file read for SSH hosts (default `~/.ssh/config`)",
    "SUPERVISE_SSH_KNOWN_HOSTS": "the known_hosts file host keys are checked against",
    "SUPERVISE_SSH_KEY": "the private key file(s) to log in with (`:`-separated)",
    "SUPERVISE_SSH_ACCEPT_NEW_HOST_KEYS": "`1`: accept (and record) a host key never seen; a changed key is "
                                          "still refused",
    "SUPERVISE_SSH_LOG_ROOT": "where attempt logs go on an SSH host (default `~/.local/state/supervise/logs`)",
    "SUPERVISE_SSH_RETRY_S": "seconds an unreachable SSH host is retried before the operation fails (default 60)",
    "SUPERVISE_SSH_NVIDIA_SMI": "the `nvidia-smi` command run on an SSH host",
    "SUPERVISE_SSH_PYTHON": "the box's Python 3 (3.8 or newer) for the resident log agent (default `python3` on its "
                            "PATH); without one the host runs no job and says so",
    "SUPERVISE_SSH_KERNEL_LOG": "the box's kernel log command, read for Xid lines (default `dmesg`; empty: not read)",
    "SUPERVISE_SSH_PYSPY": "py-spy on an SSH host (default: its PATH, else `~/.local/bin`)",
    "SUPERVISE_SLURM_LOG_ROOT": "the log root of a Slurm host, on a file system the nodes share at the same path",
    "SUPERVISE_SLURM_POLL_S": "seconds between reads of a running Slurm job's state (default 0.5)",
    "SUPERVISE_SLURM_NVIDIA_SMI": "the `nvidia-smi` command run on a Slurm node through `srun --overlap`",
}


def variables_in_code() -> dict[str, list[str]]:
    """Each SUPERVISE_* name written as a whole string in the package -> the modules that name it."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for name in _VAR.findall(path.read_text(encoding="utf-8")):
            module = str(path.relative_to(PACKAGE.parent))
            if module not in found.setdefault(name, []):
                found[name].append(module)
    return found


def _settings_rows() -> list[str]:
    from supervisor.core.config import DaemonSettings

    rows = ["| key | environment | type | default | what |", "|---|---|---|---|---|"]
    for name, info in DaemonSettings.model_fields.items():
        bounds = _bounds(info.metadata)
        kind = type_name(info.annotation) + (f" ({bounds})" if bounds else "")
        rows.append(f"| `{name}` | `{DaemonSettings.env_var(name)}` | {kind} | {default_of(info)} | "
                    f"{cell(info.description or '')} |")
    return rows


def render() -> str:
    import supervisor.core.config as config
    from supervisor.core.config import DaemonSettings

    in_code = variables_in_code()
    settings = {DaemonSettings.env_var(n) for n in DaemonSettings.model_fields}
    missing = sorted(set(in_code) - set(VARIABLES) - settings)
    gone = sorted(set(VARIABLES) - set(in_code))
    if missing or gone:
        raise SystemExit(f"docs/refgen/config.py: VARIABLES lacks {missing} and describes what the code no longer "
                         f"names: {gone}")
    out = ["# Configuration", "",
           "Generated from `supervisor/core/config.py` and the package's source by `python docs/gen_reference.py`;",
           "do not edit by hand. How to use them: [the configuration guide](../guides/configuration.md).", "",
           doc(config), "", "## Daemon settings", "", doc(DaemonSettings), "", *_settings_rows(), "",
           "## Other environment variables", "",
           "Read by the CLI, the daemon or the hosts as they run (not shown by `supervise config show`).", "",
           "| variable | what | read in |", "|---|---|---|"]
    for name in sorted(VARIABLES):
        where = ", ".join(f"`{m}`" for m in in_code[name])
        out.append(f"| `{name}` | {cell(VARIABLES[name])} | {where} |")
    return "\n".join(out).rstrip() + "\n"
