"""Who may read the page and who may act from it.

Every request needs the token: from `?token=` (the URL `supervise web` prints), an
`Authorization: Bearer` header, or the cookie set when a page was first opened with the
token.  A POST (an action) also needs to come from the page itself: its `Origin` must be this
server's own, so another site open in the same browser cannot stop a job with the cookie; a
client that sends no `Origin` (curl) must give the token in the header.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from ..errors import SuperviseError, http_status
from ._config import WebConfig

log = structlog.get_logger("supervise.web")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def cookie_name(config: WebConfig) -> str:
    return f"supervise_{config.port}"  # cookies ignore ports: one name per served port


def refuse(status: int, line: str) -> web.Response:
    """Every refusal: one line of text that says what to do."""
    return web.Response(status=status, text=" ".join(line.splitlines()) + "\n", content_type="text/plain")


def _bearer(request: web.Request) -> str | None:
    scheme, _, value = request.headers.get("Authorization", "").partition(" ")
    return value.strip() if scheme.lower() == "bearer" else None


def _matches(given: str | None, token: str) -> bool:
    return given is not None and secrets.compare_digest(given.encode(), token.encode())


def middleware(config: WebConfig) -> Middleware:
    name = cookie_name(config)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        in_query = request.query.get("token")
        in_header = _bearer(request)
        if not any(_matches(g, config.token) for g in (in_query, in_header, request.cookies.get(name))):
            return refuse(401, "no valid token: open the URL that `supervise web` printed (it ends in ?token=...)")
        if request.method not in ("GET", "HEAD"):
            origin = request.headers.get("Origin")
            if origin is None and not _matches(in_header, config.token):
                return refuse(403, "an action needs the token in an Authorization: Bearer header, or the page's own origin")
            if origin is not None and origin != f"{request.scheme}://{request.host}":
                return refuse(403, f"refused an action from another origin ({origin[:100]})")
        if in_query is not None and request.method == "GET" and not request.path.startswith("/api/"):
            # Trade the token in the address bar for a cookie, and drop it from the address.
            rest = {k: v for k, v in request.query.items() if k != "token"}
            response = web.HTTPSeeOther(request.rel_url.with_query(rest))
            response.set_cookie(name, config.token, httponly=True, samesite="Strict", path="/")
            return response
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
