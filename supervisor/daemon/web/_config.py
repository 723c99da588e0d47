"""Where the web page is served and its token: one file in the state directory, mode 0600.

The file outlives the daemon on purpose: a restarted daemon serves the page again at the same
address with the same token, so an open browser tab reconnects by itself and resumes its
event stream from the last event id it saw.  A page that moves (`supervise web --port N`), or
whose port another program took meanwhile, gets a new token.  `supervise web --off` deletes it.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
from pathlib import Path

from pydantic import BaseModel, Field, ValidationError

from supervisor.core.config import Paths
from supervisor.core.errors import ConfigError


class WebConfig(BaseModel):
    bind: str
    port: int = Field(ge=1, le=65535)
    read_only: bool = False
    token: str = Field(min_length=16)

    @property
    def url(self) -> str:
        host = f"[{self.bind}]" if ":" in self.bind else self.bind
        # In the fragment: a browser never sends it to any server (a query or a cookie would go to
        # whatever answers on that address, and cookies to every port of the host).
        return f"http://{host}:{self.port}/#token={self.token}"


def config_path(paths: Paths) -> Path:
    return paths.state_dir / "web.json"


def new_token() -> str:
    return secrets.token_urlsafe(24)


def is_loopback(bind: str) -> bool:
    if bind == "localhost":
        return True
    try:
        return ipaddress.ip_address(bind).is_loopback
    except ValueError:
        return False


def check_bind(bind: str, allow_remote: bool) -> None:
    """Loopback only, unless asked for explicitly: the page can stop jobs."""
    if is_loopback(bind) or allow_remote:
        return
    try:
        ipaddress.ip_address(bind)
    except ValueError:
        raise ConfigError(f"--bind {bind!r} is not an IP address (e.g. 127.0.0.1)") from None
    raise ConfigError(f"--bind {bind} is not a loopback address: use `ssh -L 8787:127.0.0.1:8787 box`, "
                      "or pass --allow-remote to expose the page (the token still guards it)")


def load(paths: Paths) -> WebConfig | None:
    """The saved configuration; None when the page is off (or the file is unreadable: said once)."""
    path = config_path(paths)
    try:
        return WebConfig.model_validate_json(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValidationError) as exc:
        raise ConfigError(f"{path} is unreadable ({' '.join(str(exc).splitlines())[:200]}); "
                          "run `supervise web` again to rewrite it") from exc


def save(paths: Paths, config: WebConfig) -> None:
    """Written 0600 from birth (the token is a password), replaced atomically."""
    path = config_path(paths)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(config.model_dump_json())
    os.chmod(tmp, 0o600)  # an older tmp file kept its mode through O_CREAT
    os.replace(tmp, path)


def remove(paths: Paths) -> None:
    config_path(paths).unlink(missing_ok=True)
