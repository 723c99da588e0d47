"""The daemon process: wiring only.  `python -m supervisor.daemon.process` runs it.

    service   lifecycle: lock, recovery pass, runners, shutdown
    api       the HTTP API on the Unix socket: handlers, route table, error map, OpenAPI
    hosts/    the host registry (one connection and GPU monitor per host)

A first SIGTERM/SIGINT detaches from the jobs and exits; a second exits at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import structlog

from supervisor.core.config import DaemonSettings, LoadedSettings, Paths, default_paths, load_settings
from supervisor.core.errors import SuperviseError
from supervisor.core.filemodes import restrict_umask
from supervisor.daemon.service import Service

# The name tests and tools know the service by.
Daemon = Service

log = structlog.get_logger("supervise.daemon")


def configure_logging() -> None:
    renderer: Any = structlog.dev.ConsoleRenderer() if sys.stderr.isatty() else structlog.processors.JSONRenderer()
    structlog.configure(processors=[
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso"),
        structlog.processors.format_exc_info,
        renderer,
    ], logger_factory=structlog.PrintLoggerFactory(sys.stderr))


def run_daemon(paths: Paths | None = None) -> int:
    restrict_umask()  # before any file is created: the store, the socket, the pid file
    configure_logging()
    paths = paths or default_paths()
    loaded = load_settings(paths)
    return asyncio.run(_main(paths, loaded.settings, loaded))


async def _main(paths: Paths, settings: DaemonSettings, loaded: LoadedSettings | None = None) -> int:
    loop = asyncio.get_running_loop()
    daemon = Service(paths, settings, loaded=loaded)
    signals_seen = 0

    def on_signal(signum: int) -> None:
        nonlocal signals_seen
        signals_seen += 1
        if signals_seen > 1:  # a second Ctrl-C: the user wants out now
            log.warning("second signal: exiting immediately")
            os._exit(130)
        log.info("signal received: shutting down", signal=signal.Signals(signum).name)
        daemon.request_stop()

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        await daemon.serve()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
    return 0


def main() -> None:
    try:
        code = run_daemon()
    except SuperviseError as exc:  # bad configuration, another daemon running: one line, its exit code
        print(f"supervise daemon: {exc}", file=sys.stderr)
        code = exc.exit_code
    sys.exit(code)


if __name__ == "__main__":
    main()

