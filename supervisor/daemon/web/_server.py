"""The page's HTTP server: its routes, and starting and stopping it inside the daemon.

Read-only data comes from what the control API reads (the store, runner snapshots, the GPU
monitor); the one action, stop, is the control API's own handler behind the token and the
same-origin check of `_auth`.
"""

from __future__ import annotations

import asyncio
import errno
from importlib import resources

import structlog
from aiohttp import web

from supervisor.core import protocol
from supervisor.core.errors import ConfigError, NotFound, RequestRejected
from supervisor.daemon import streams
from supervisor.daemon.api import REQUEST_TIMEOUT, Api, Handler
from supervisor.daemon.api import Service as WebService
from supervisor.daemon.web import _auth, _config
from supervisor.daemon.web._config import WebConfig
from supervisor.daemon.web._handshake import Handshake
from supervisor.daemon.web._status import LogTail, log_tail, page_status
from supervisor.daemon.web._stream import EventStream

log = structlog.get_logger("supervise.web")

_STATIC = resources.files("supervisor.daemon.web") / "static"
_PAGES = {"overview": "index.html", "job": "job.html"}
_ASSETS = {"app.css": "text/css", "common.js": "text/javascript", "overview.js": "text/javascript",
           "job.js": "text/javascript"}
# Actions: page verb -> the control API handler that does it (restart joins when the API has it).
# The page's buttons, each the control API's own handler (the same checks and answers as the CLI's verbs).
ACTIONS: dict[str, Handler] = {"stop": Api.stop_job, "restart": Api.restart_job, "hold": Api.hold_job,
                               "release": Api.release_job}


def _int(request: web.Request, key: str, default: int | None, low: int, high: int) -> int | None:
    value = request.query.get(key)
    if key == "after" and "Last-Event-ID" in request.headers:
        value = request.headers["Last-Event-ID"]  # a reconnecting browser: resume where it was
    if value in (None, ""):
        return default
    try:
        number = int(value)
    except ValueError:
        raise RequestRejected(f"{key} must be an integer between {low} and {high}, not {value[:40]!r}", 400) from None
    if not low <= number <= high:
        raise RequestRejected(f"{key} must be an integer between {low} and {high}, not {number}", 400)
    return number


class Pages:
    def __init__(self, service: WebService, config: WebConfig, handshake: Handshake) -> None:
        self.service = service
        self.config = config
        self.handshake = handshake
        self.api = Api(service)

    async def hello(self, request: web.Request) -> web.StreamResponse:
        nonce = request.query.get("nonce", "")
        if not Handshake.valid_nonce(nonce):
            raise RequestRejected("nonce must be 32 to 128 lowercase hex digits", 400)
        return web.Response(text=self.handshake.hello(nonce).model_dump_json(), content_type="application/json",
                            headers={"Cache-Control": "no-store"})

    def _job(self, request: web.Request) -> str:
        name = request.match_info["name"]
        self.service.store.job(name)  # NotFound -> 404
        return name

    async def page(self, request: web.Request) -> web.StreamResponse:
        # Served without the token (the fragment URL must load it): no data, not even whether the
        # job exists; the page's script asks the API, which needs the token, and says what it answers.
        text = (_STATIC / _PAGES["job" if "name" in request.match_info else "overview"]).read_text()
        return web.Response(text=text, content_type="text/html", headers={"Cache-Control": "no-store"})

    async def asset(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["asset"]
        if name not in _ASSETS:
            raise NotFound(f"no asset {name[:60]!r}")
        return web.Response(text=(_STATIC / name).read_text(), content_type=_ASSETS[name])

    async def stream(self, request: web.Request) -> web.StreamResponse:
        job = request.query.get("job") or None
        if job is not None:
            self.service.store.job(job)
        after = _int(request, "after", None, 0, 2**62)
        return await EventStream(self.service, job, after,
                                 lambda: page_status(self.service, self.config.read_only, job)).serve(request)

    async def log(self, request: web.Request) -> web.StreamResponse:
        name = self._job(request)
        n = _int(request, "attempt", None, 1, 2**31)
        lines = _int(request, "lines", 200, 1, 5000) or 200
        row = self.service.store.attempt(name, n) if n else self.service.store.latest_attempt(name)
        if row is None:
            return web.Response(text=LogTail(attempt=0, lines=[], partial="").model_dump_json(),
                                content_type="application/json")
        host = self.service.hosts.get(row.host).host
        tail = await asyncio.wait_for(log_tail(host, host.capabilities.files_here, row.n, row.log_path, lines,
                                               known_end=row.log_offset), timeout=20)
        return web.Response(text=tail.model_dump_json(), content_type="application/json")

    async def gpu(self, request: web.Request) -> web.StreamResponse:
        self._job(request)
        return await self.api.job_gpu(request)

    async def action(self, request: web.Request) -> web.StreamResponse:
        self._job(request)
        if self.config.read_only:
            raise RequestRejected("the page is read-only (`supervise web --read-only`); use the CLI", 403)
        verb = request.match_info["verb"]
        if verb not in ACTIONS:
            raise RequestRejected(f"no action {verb[:40]!r}; the page can {', '.join(ACTIONS)}", 404)
        return await ACTIONS[verb](self.api, request)


def build_web_app(service: WebService, config: WebConfig) -> web.Application:
    handshake = Handshake(config.token)  # a new instance each start: old session credentials die with it
    pages = Pages(service, config, handshake)
    app = web.Application(middlewares=[_auth.middleware(config, handshake)])
    app[REQUEST_TIMEOUT] = service.settings.request_timeout_s  # the control API's handlers read it
    streams.track(app)  # a stop ends the live feeds at once
    app.router.add_get("/", pages.page)
    app.router.add_get("/job/{name}", pages.page)
    app.router.add_get("/static/{asset}", pages.asset)
    app.router.add_get(_auth.HELLO_PATH, pages.hello)
    app.router.add_get("/api/stream", pages.stream)
    app.router.add_get("/api/jobs/{name}/log", pages.log)
    app.router.add_get("/api/jobs/{name}/gpu", pages.gpu)
    app.router.add_post("/api/jobs/{name}/{verb}", pages.action)
    return app


def _bind_failure(config: WebConfig, exc: OSError) -> str:
    address = f"[{config.bind}]:{config.port}" if ":" in config.bind else f"{config.bind}:{config.port}"
    if exc.errno == errno.EADDRINUSE:  # another program (or another daemon) listens there
        return (f"{address} is taken by another process; serve the page on a free port with "
                f"`supervise web --port N` (saved in web.json)")
    return f"cannot listen on {address}: {exc.strerror or exc}; try `supervise web --port N --bind 127.0.0.1`"


class WebUi:
    """The page's server inside the daemon: off until `supervise web` (or a saved web.json)."""

    def __init__(self, service: WebService) -> None:
        self.service = service
        self.config: WebConfig | None = None
        self._runner: web.AppRunner | None = None
        # Why the page asked for is not served (its port taken while the daemon was down, say):
        # `status` and `doctor` say so, rather than an open tab reaching whatever holds the port.
        self.problem: str | None = None

    async def resume(self) -> None:
        """At daemon start: serve again what the last `supervise web` asked for, same token.

        If the address cannot be had (its port taken while the daemon was down), the token is
        replaced: whatever holds the port may have been handed the old one by an open tab of an
        older page, and it must not work wherever the page is served next."""
        config: WebConfig | None = None
        try:
            config = _config.load(self.service.paths)
            if config is not None:
                await self._serve(config)
        except ConfigError as exc:
            self.problem = f"the web page is not served: {exc}"
            log.error("web page not served", error=str(exc))
            if config is not None:
                _config.save(self.service.paths, config.model_copy(update={"token": _config.new_token()}))

    async def configure(self, request: protocol.WebRequest) -> protocol.WebResponse:
        if request.off:
            await self.close()
            _config.remove(self.service.paths)
            self.problem = None
            return protocol.WebResponse(url="", message="the web page is off")
        _config.check_bind(request.bind, request.allow_remote)
        saved = self.config or _config.load(self.service.paths)
        # The same address keeps its token (open tabs keep working); a page that moves gets a new
        # one: its old port is anyone's now, and so is anything a tab gave whoever takes it.
        same_address = saved is not None and (saved.bind, saved.port) == (request.bind, request.port)
        token = saved.token if saved is not None and same_address else _config.new_token()
        config = WebConfig(bind=request.bind, port=request.port, read_only=request.read_only, token=token)
        if config != self.config:
            if self.config is not None and (self.config.bind, self.config.port) == (config.bind, config.port):
                await self.close()  # the same address: free it for the new server
            runner = await self._start(config)  # on failure the page already served stays up
            await self.close()
            self._runner, self.config = runner, config
        _config.save(self.service.paths, config)
        self.problem = None
        mode = " (read-only)" if config.read_only else ""
        return protocol.WebResponse(url=config.url, message=f"serving the web page{mode} at {config.url}")

    async def _serve(self, config: WebConfig) -> None:
        self._runner, self.config = await self._start(config), config

    async def _start(self, config: WebConfig) -> web.AppRunner:
        runner = web.AppRunner(build_web_app(self.service, config), access_log=None, handle_signals=False,
                               shutdown_timeout=0.5)  # open event streams must not hold up a stop
        await runner.setup()
        try:
            await web.TCPSite(runner, config.bind, config.port).start()
        except OSError as exc:
            await runner.cleanup()
            raise ConfigError(_bind_failure(config, exc)) from exc
        log.info("web page served", address=f"{config.bind}:{config.port}", read_only=config.read_only)
        return runner

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner, self.config = None, None
