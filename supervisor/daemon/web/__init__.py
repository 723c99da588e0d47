"""The live web page: served by the daemon on loopback TCP behind a token (`supervise web`)."""

from supervisor.daemon.web._server import WebUi, build_web_app

__all__ = ["WebUi", "build_web_app"]
