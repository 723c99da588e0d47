"""The daemon itself and the offline tools: `daemon [start|stop|restart]`, `config show`,
`probe`, `doctor`, and `web` (the daemon's web page)."""

from __future__ import annotations

import argparse
import time

from supervisor.cli._args import client as _client
from supervisor.cli.client import Client
from supervisor.core import protocol
from supervisor.core.config import default_paths
from supervisor.core.errors import DaemonError


def cmd_daemon(args: argparse.Namespace) -> int:
    if args.foreground:
        from supervisor.daemon.process import run_daemon

        return run_daemon()
    client = Client(default_paths())
    if args.action in ("stop", "restart"):
        _stop_daemon(client)
        if args.action == "stop":
            return 0
    ping = client.ensure_daemon()
    print(f"daemon running: pid {ping.pid}, version {ping.version}, state {ping.state_dir}")
    return 0


def _stop_daemon(client: Client, timeout_s: float = 30.0) -> None:
    """Ask the daemon to exit (its jobs keep running) and wait until its process is gone, so a
    daemon started next can take the state directory's lock."""
    if not client.accepting():
        print("daemon not running")
        return
    response = client.stop_daemon()
    deadline = time.monotonic() + timeout_s
    while _alive(response.pid):
        if time.monotonic() > deadline:
            raise DaemonError(f"the daemon (pid {response.pid}) did not exit within {timeout_s:.0f}s; "
                              f"see {client.paths.daemon_log}")
        time.sleep(0.05)
    print(f"supervise: {response.message}")


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def cmd_config(args: argparse.Namespace) -> int:
    from supervisor.core.config import describe_settings, load_settings

    client = Client(default_paths())
    running = client.accepting()
    response = client.config() if running else describe_settings(load_settings(default_paths()))
    client.close()
    if args.json:
        print(response.model_dump_json(indent=2))
        return 0
    origin = "the running daemon's" if running else "no daemon running; as a daemon started from this shell would read them"
    print(f"config file: {response.config_file} ({'present' if response.config_file_exists else 'absent'}); settings: {origin}")
    if response.changed_since_start:
        print("  the config file changed since the daemon started: these are the values it runs with; "
              "`supervise daemon restart` reads it again (jobs keep running)")
    width = max(len(s.name) for s in response.settings)
    for setting in response.settings:
        value = " ".join(setting.value) if isinstance(setting.value, list) else setting.value
        print(f"  {setting.name:<{width}} = {value if value not in (None, '') else '(unset)'!s:<24} from {setting.source}")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from supervisor.cli.doctor import doctor_command

    return doctor_command(args.host)


def cmd_web(args: argparse.Namespace) -> int:
    request = protocol.WebRequest.model_construct(port=args.port, bind=args.bind, allow_remote=args.allow_remote,
                                                  read_only=args.read_only, off=args.off)
    print(_client().web(request).message)
    return 0
