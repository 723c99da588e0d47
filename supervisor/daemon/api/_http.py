"""HTTP plumbing of the control API: the one error map (errors.TABLE -> ErrorBody and status),
request bodies and query values checked into one-line 400s, JSON and NDJSON answers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import structlog
from aiohttp import web
from pydantic import BaseModel, ValidationError

from supervisor.core import protocol
from supervisor.core.errors import (
    InternalError,
    RequestRejected,
    SuperviseError,
    http_status,
    row_of,
)
from supervisor.daemon import streams as _streams

if TYPE_CHECKING:
    pass

log = structlog.get_logger("supervise.api")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# How long a client may take to send a request body (headers: the server's own idle timer).
REQUEST_TIMEOUT = web.AppKey("request_timeout_s", float)
_DEFAULT_BODY_TIMEOUT_S = 10.0  # for an app that does not set its own (the web page reuses these handlers)


EVENTS_PAGE = 10_000  # the most events one answer holds: a reader pages on with `after`


@web.middleware
async def _errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except SuperviseError as exc:
        return _error(exc)
    except Exception as exc:  # a bug in one request must not take the daemon down
        log.exception("request failed", path=request.path)
        return _error(InternalError(f"internal error: {exc!r} (see the daemon log)"))


def _error(exc: SuperviseError) -> web.Response:
    """The one answer to an error: its kind and exit code from errors.TABLE, its message on one line."""
    body = protocol.ErrorBody(error=" ".join(str(exc).splitlines()), kind=row_of(exc).kind, exit_code=exc.exit_code)
    return web.json_response(body.model_dump(mode="json"), status=http_status(exc))


def _json(model: BaseModel) -> web.Response:
    return web.Response(text=model.model_dump_json(), content_type="application/json")


async def _body(request: web.Request, model: type[Any]) -> Any:
    timeout = request.app.get(REQUEST_TIMEOUT, _DEFAULT_BODY_TIMEOUT_S)
    try:
        raw = await asyncio.wait_for(request.read(), timeout)
        return model.model_validate_json(raw or b"{}")
    except TimeoutError as exc:
        raise RequestRejected(f"the request body did not arrive within {timeout:g}s", 408) from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise RequestRejected(f"bad request body: {_cut(where + ': ' if where else '')}{_cut(str(first['msg']))}", 400) from exc


_MAX_QUERY_INT = 2**63 - 1  # SQLite's INTEGER: a larger number would fail in the store, not here


def _int_query(request: web.Request, key: str, low: int = 0, high: int = _MAX_QUERY_INT) -> int | None:
    value = request.query.get(key)
    if value in (None, ""):
        return None
    try:
        number: int | None = int(value)
    except ValueError:  # also a string of more digits than int() converts
        number = None
    if number is None or not low <= number <= high:
        raise RequestRejected(f"query parameter {key} must be an integer from {low} to {high}", 400)
    return number


def _path_name(request: web.Request) -> str:
    return _checked_name(request.match_info["name"], "job name")


def _checked_name(value: str, what: str) -> str:
    """A name or path from a request, refused (400) when it holds a control character: a NUL
    reaches the OS or SQLite as an error, a newline splits log and error lines."""
    if any(ord(c) < 32 or c == "\x7f" for c in value):
        raise RequestRejected(f"{what} must not contain control characters (NUL, newline): {_cut(value)!r}", 400)
    return value


def _cut(text: str, limit: int = 120) -> str:
    """An echoed value, at most ``limit`` characters: an error line stays one short line."""
    return text if len(text) <= limit else text[:limit] + "…"


async def _ndjson(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    _streams.opened(request)  # a daemon stop ends it at once
    return response


async def _write_line(response: web.StreamResponse, model: BaseModel) -> None:
    await response.write(model.model_dump_json().encode() + b"\n")
