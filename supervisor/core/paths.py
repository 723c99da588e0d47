"""Where the supervisor keeps its state: the state directory and the files in it.

State directory: `$SUPERVISE_HOME`, else `$XDG_STATE_HOME/supervise`, else `~/.local/state/supervise`.
Standard library only: shell completion asks the daemon for job names on every Tab, through this module
and nothing heavier (supervisor/shell_names.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from supervisor.core.errors import ConfigError


@dataclass(frozen=True)
class Paths:
    state_dir: Path

    @property
    def db(self) -> Path:
        return self.state_dir / "supervise.db"

    @property
    def socket(self) -> Path:
        return self.state_dir / "daemon.sock"

    @property
    def daemon_log(self) -> Path:
        return self.state_dir / "daemon.log"

    @property
    def pid_file(self) -> Path:
        return self.state_dir / "daemon.pid"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    @property
    def arrivals(self) -> Path:
        """When each attempt's log lines arrived (arrivals.py), for `logs --timestamps`."""
        return self.state_dir / "arrivals"

    @property
    def notify(self) -> Path:
        """Each local attempt's ``NOTIFY_SOCKET`` (hosts/local/notify.py)."""
        return self.state_dir / "notify"


def default_paths() -> Paths:
    explicit = os.environ.get("SUPERVISE_HOME")
    if explicit:
        state = Path(explicit)
    else:
        xdg = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        state = Path(xdg) / "supervise"
    state = state.expanduser().absolute()
    if len(str(state / "daemon.sock")) > 100:
        raise ConfigError(
            f"state directory {state} is too long for a Unix socket path (limit ~100 bytes): set SUPERVISE_HOME to a shorter path"
        )
    return Paths(state)
