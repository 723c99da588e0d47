"""Who may read the page and who may act from it.

The URL `supervise web` prints carries the token in its fragment (`/#token=...`), which a
browser never sends anywhere: the page's script keeps it in `sessionStorage` (readable by this
origin only: scheme, host and port).  It sends nothing of it before the server has proved it is
the daemon (`_handshake`), then a credential derived from it as `Authorization: Bearer`; an
event stream, which cannot set headers, gives that as `?token=`.  No cookie: cookies ignore
ports, so any other server on the same host would receive one.  The page itself (its HTML,
script and style: no data) and the handshake are served without a token, so that a fragment
URL can load it and prove the server.

Every request's `Host` must name the address the page is served on (DNS rebinding: another
site's name resolved to 127.0.0.1 must not reach it).  A POST (an action) needs the token in
the header, and an `Origin`, when sent, of this server's own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from supervisor.core.errors import SuperviseError, http_status
from supervisor.daemon.web._config import WebConfig, is_loopback
from supervisor.daemon.web._handshake import Handshake

log = structlog.get_logger("supervise.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


_PUBLIC_PREFIXES = ("/static/", "/job/")  # the page's HTML, script and style: no data in them
HELLO_PATH = "/api/hello"  # the handshake: a nonce in, a proof out, nothing else


def _public(request: web.Request) -> bool:
    return request.method in ("GET", "HEAD") and (request.path in ("/", HELLO_PATH)
                                                  or request.path.startswith(_PUBLIC_PREFIXES))


def allowed_hosts(config: WebConfig) -> frozenset[str] | None:
    """The `Host` values a request may carry; None: any (a page bound to a non-loopback address
    with --allow-remote is reached by names this server cannot know)."""
    if not is_loopback(config.bind):
        return None
    bind = f"[{config.bind}]" if ":" in config.bind else config.bind
    names = ("127.0.0.1", "localhost", "[::1]", bind)
    bare = names if config.port == 80 else ()  # a browser leaves out the scheme's own port
    return frozenset(f"{name}:{config.port}" for name in names) | frozenset(bare)


def refuse(status: int, line: str) -> web.Response:
    """Every refusal: one line of text that says what to do."""
    return web.Response(status=status, text=" ".join(line.splitlines()) + "\n", content_type="text/plain")


def _bearer(request: web.Request) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def middleware(config: WebConfig, handshake: Handshake) -> Middleware:
    hosts = allowed_hosts(config)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if hosts is not None and request.host.lower() not in hosts:
            return refuse(421, f"this page answers to 127.0.0.1:{config.port} only, not {request.host[:100]!r}: "
                               "open the URL that `supervise web` printed")
        in_header = _bearer(request)
        given: tuple[str | None, ...]
        if request.method in ("GET", "HEAD"):
            given = (in_header, request.query.get("token"))  # ?token=: an event stream cannot send a header
        else:
            given = (in_header,)
        if not _public(request) and not any(handshake.accepts(g) for g in given):
            if request.method not in ("GET", "HEAD") and handshake.accepts(request.query.get("token")):
                return refuse(403, "an action needs the token in an Authorization: Bearer header")
            return refuse(401, "no valid token: open the URL that `supervise web` printed (it ends in #token=...)")
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("Origin")
            if origin is not None and origin != f"{request.scheme}://{request.host}":
                return refuse(403, f"refused an action from another origin ({origin[:100]})")
        try:
            return await handler(request)
        except SuperviseError as exc:
            return refuse(http_status(exc), str(exc))
        except web.HTTPException:
            raise
        except Exception as exc:  # a bug in one request must not take the daemon down
            log.exception("web request failed", path=request.path)
            return refuse(500, f"internal error: {exc!r} (see the daemon log)")

    return guard
