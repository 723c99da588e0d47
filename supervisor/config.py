"""Where the supervisor keeps its state, and the few settings the daemon reads at start-up.

State directory: `$SUPERVISE_HOME`, else `$XDG_STATE_HOME/supervise`, else
`~/.local/state/supervise`.  It holds the store (`supervise.db`), the control socket
(`daemon.sock`), the daemon's own log (`daemon.log`) and local attempt logs (`logs/`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError


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


@dataclass(frozen=True)
class DaemonSettings:
    gpu_interval_s: float = 2.0  # NVML sampling period
    gpu_store_every_s: float = 10.0  # how often a GPU sample is written to the store
    poll_interval_s: float = 0.5  # fallback when pidfd/inotify are unavailable
    alert_urls: tuple[str, ...] = ()
    alert_min_interval_s: float = 60.0

    @classmethod
    def from_env(cls) -> DaemonSettings:
        urls = tuple(u for u in os.environ.get("SUPERVISE_ALERT_URLS", "").split() if u)
        try:
            return cls(
                gpu_interval_s=float(os.environ.get("SUPERVISE_GPU_INTERVAL_S", cls.gpu_interval_s)),
                gpu_store_every_s=float(os.environ.get("SUPERVISE_GPU_STORE_EVERY_S", cls.gpu_store_every_s)),
                poll_interval_s=float(os.environ.get("SUPERVISE_POLL_INTERVAL_S", cls.poll_interval_s)),
                alert_urls=urls,
                alert_min_interval_s=float(os.environ.get("SUPERVISE_ALERT_MIN_INTERVAL_S", cls.alert_min_interval_s)),
            )
        except ValueError as exc:
            raise ConfigError(f"bad SUPERVISE_* setting: {exc}") from exc
