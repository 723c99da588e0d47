"""Where the supervisor keeps its state, and the settings the daemon reads at start-up.

State directory: `$SUPERVISE_HOME`, else `$XDG_STATE_HOME/supervise`, else
`~/.local/state/supervise`.  It holds the store (`supervise.db`), the control socket
(`daemon.sock`), the daemon's own log (`daemon.log`), local attempt logs (`logs/`) and
the optional config file (`config.toml`; `$SUPERVISE_CONFIG` names another one).

Settings (`DaemonSettings`) come from, in order of precedence: `SUPERVISE_<NAME>`
environment variables, the config file (`name = value`, one key per field), the defaults.
`supervise config show` prints the effective values and where each came from.
"""

from __future__ import annotations

import ipaddress
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from supervisor.core.errors import ConfigError
from supervisor.core.paths import Paths as Paths
from supervisor.core.paths import default_paths as default_paths

# Paths live in their own module (no pydantic), so shell completion can find the socket without loading
# settings; they are re-exported here, where most of the package has always imported them.
# -- daemon settings: one typed model, read from a TOML file and the environment ------------

_ENV_PREFIX = "SUPERVISE_"
CONFIG_ENV = "SUPERVISE_CONFIG"


class DaemonSettings(BaseModel):
    """Settings the daemon reads at start-up.  Each field can be set in the config file
    (`$SUPERVISE_CONFIG`, else `$SUPERVISE_HOME/config.toml`) under its own name, or in the
    environment as `SUPERVISE_<NAME>` (upper case); the environment wins over the file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpu_interval_s: float = Field(2.0, gt=0, description="seconds between two GPU samples of a host (NVML locally, nvidia-smi over SSH)")
    gpu_store_every_s: float = Field(10.0, ge=0, description="how often a GPU sample is also written to the store (history for `supervise report`)")
    poll_interval_s: float = Field(0.5, gt=0, description="log polling period where inotify is unavailable")
    cgroup_root: str = Field("", max_length=4096, description="a delegated cgroup v2 directory without processes of "
                             "its own (e.g. systemd's Delegate=yes) where local attempts get their cgroups, with the "
                             "memory, cpu and pids controllers that a spec's [limits] needs (\"\": under the "
                             "daemon's own cgroup)")
    kernel_log: str = Field("/dev/kmsg", max_length=4096, description="the local kernel log, read for GPU Xid errors "
                            "where NVML's event set cannot report them (\"\": not read)")
    alert_urls: tuple[str, ...] = Field((), description="apprise URLs that alerts go to (in the environment: separated by "
                                        "spaces); `failure,gpu_fault=URL` sends that URL only alerts of those "
                                        "severities or kinds")
    alert_min_interval_s: float = Field(60.0, ge=0, description="at most one alert per job and kind within this many seconds")
    metrics_addr: str | None = Field(None, description="host:port for Prometheus metrics over TCP, loopback only (e.g. 127.0.0.1:9464); "
                                                    "off when unset; /metrics on the control socket is always on")
    loop_lag_interval_s: float = Field(0.5, gt=0, description="how often the daemon measures its event loop's lag (the sleep's overshoot)")
    request_timeout_s: float = Field(10.0, gt=0, le=3600, description="seconds a client may take to send a request's "
                                     "headers, and again its body; a slower one is disconnected")
    log_keep_attempts: int = Field(20, ge=1, description="attempt logs kept per job: older ones are deleted at each launch "
                                                         "and by `supervise prune`, with their progress and metric events (a running attempt's log never is)")
    events_per_attempt: int = Field(10_000, ge=100, le=10_000_000, description="events read from an attempt's log "
                                    "that the store keeps; past it the attempt's progress, metric and info lines are "
                                    "not stored (one action event says so; each bar's latest count, phases and failures still are)")
    log_max_bytes: int = Field(0, ge=0, description="per job, older attempt logs are deleted until the job's logs "
                                                    "fit in this many bytes (0: no limit; the running attempt's log is kept)")
    quarantine_gpu_s: float = Field(3600.0, ge=0, le=365 * 86400, description="how long a GPU is kept away from "
                                    "after a hardware fault (an Xid such as 48, 79 or 94, uncorrected ECC): "
                                    "`devices = \"all\"` jobs launch without it (0: off)")
    quarantine_host_s: float = Field(900.0, ge=0, le=365 * 86400, description="how long a host is kept away from "
                                     "after quarantine_strikes attempts in a row there end killed or "
                                     "unreachable: jobs with a host pool go elsewhere (0: off)")
    quarantine_strikes: int = Field(2, ge=1, le=1000, description="attempts in a row ending killed or unreachable "
                                       "on one host that quarantine it")

    @field_validator("alert_urls", mode="before")
    @classmethod
    def _split_urls(cls, value: Any) -> Any:
        urls = tuple(value.split()) if isinstance(value, str) else value
        if isinstance(urls, (tuple, list)):
            from supervisor.core.alert_routes import parse_route

            for entry in urls:
                if isinstance(entry, str):
                    parse_route(entry)  # a route naming no severity or kind: one line saying which exist
        return urls

    @field_validator("metrics_addr", mode="before")
    @classmethod
    def _loopback_only(cls, value: Any) -> Any:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        if not isinstance(value, str):
            raise ValueError("expected a string 'host:port'")
        host, port = parse_loopback_addr(value)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def metrics_bind(self) -> tuple[str, int] | None:
        """(host, port) to bind the TCP metrics endpoint to, or None when it is off."""
        return parse_loopback_addr(self.metrics_addr) if self.metrics_addr else None

    @classmethod
    def env_var(cls, field: str) -> str:
        return _ENV_PREFIX + field.upper()

    @classmethod
    def from_env(cls, paths: Paths | None = None) -> DaemonSettings:
        """The effective settings: defaults, then the config file, then the environment."""
        return load_settings(paths).settings


def parse_loopback_addr(addr: str) -> tuple[str, int]:
    """`host:port` (`[::1]:port` for IPv6) with a loopback host; anything else is refused:
    the endpoint has no authentication, so it is never exposed beyond this machine."""
    text = addr.strip()
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
    else:
        host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"'{addr}' is not host:port (e.g. 127.0.0.1:9464)")
    if host != "localhost":
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            raise ValueError(f"'{addr}' is not a loopback address: the metrics endpoint binds only to 127.0.0.0/8, "
                             "::1 or localhost (put an authenticating proxy in front to expose it)")
    return host, int(port_text)


@dataclass(frozen=True)
class LoadedSettings:
    """The effective settings and where each value came from."""

    settings: DaemonSettings
    sources: dict[str, str]  # field -> "default" | "<config file>" | "env SUPERVISE_X"
    config_file: Path
    config_file_exists: bool
    config_digest: str | None = None  # of the file as read (None: absent): to tell when it changed since


def file_digest(path: Path) -> str | None:
    """The file's content hash, None when it does not exist or cannot be read."""
    import hashlib

    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def config_changed(loaded: LoadedSettings) -> bool:
    """Whether the config file differs now from what the settings were read from."""
    return file_digest(loaded.config_file) != loaded.config_digest


def config_file_path(paths: Paths | None = None, environ: Mapping[str, str] | None = None) -> Path:
    """`$SUPERVISE_CONFIG`, else `config.toml` in the state directory."""
    explicit = (os.environ if environ is None else environ).get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser().absolute()
    return (paths or default_paths()).state_dir / "config.toml"


def load_settings(paths: Paths | None = None, environ: Mapping[str, str] | None = None) -> LoadedSettings:
    """Defaults, overridden by the config file, overridden by `SUPERVISE_*` variables.

    A malformed file or value raises `ConfigError` with one line naming the file (or the
    variable) and the key."""
    env = os.environ if environ is None else environ
    explicit = env.get(CONFIG_ENV)
    path = config_file_path(paths, env)
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    exists = path.is_file()
    digest = file_digest(path) if exists else None
    if explicit and not exists:
        raise ConfigError(f"config {path}: no such file (named by {CONFIG_ENV})")
    if exists:
        for key, value in _read_toml(path).items():
            if key not in DaemonSettings.model_fields:
                known = ", ".join(DaemonSettings.model_fields)
                raise ConfigError(f"config {path}: key '{key}': unknown setting (known: {known})")
            values[key] = value
            origin[key] = str(path)
    for key in DaemonSettings.model_fields:
        var = DaemonSettings.env_var(key)
        if var in env:
            values[key] = env[var]
            origin[key] = f"env {var}"
    try:
        settings = DaemonSettings.model_validate(values)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = str(error["loc"][0]) if error["loc"] else "?"
        where = origin.get(key, "default")
        place = f"config {where}: key '{key}'" if not where.startswith("env ") else f"environment {where[4:]}"
        shown = "" if key == "alert_urls" else f" (got {values.get(key)!r})"  # URLs carry secrets
        raise ConfigError(f"{place}: {_message(error)}{shown}") from exc
    sources = {key: origin.get(key, "default") for key in DaemonSettings.model_fields}
    return LoadedSettings(settings, sources, path, exists, digest)


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path}: not valid TOML: {exc}") from exc
    except OSError as exc:
        raise ConfigError(f"config {path}: cannot read it: {exc.strerror}") from exc


def _message(error: Any) -> str:
    message = str(error.get("msg", "invalid value"))
    return message.removeprefix("Value error, ")


def describe_settings(loaded: LoadedSettings) -> Any:
    """The effective settings as the API shows them (alert URLs redacted: they carry secrets)."""
    from supervisor.core.protocol import ConfigResponse, SettingInfo
    from supervisor.core.redact import redact_url

    rows = []
    for name, field in DaemonSettings.model_fields.items():
        value = getattr(loaded.settings, name)
        if name == "alert_urls":
            value = [redact_url(url) for url in value]
        rows.append(SettingInfo(name=name, value=value, source=loaded.sources.get(name, "default"),
                                env=DaemonSettings.env_var(name), description=field.description or ""))
    return ConfigResponse(config_file=str(loaded.config_file), config_file_exists=loaded.config_file_exists, settings=rows)
