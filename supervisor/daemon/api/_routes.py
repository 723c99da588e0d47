"""A route of the control API: method, path, the handler itself, and its request and response
models.  The table (``ROUTES``) is built next to the handlers (``_handlers``), each entry naming
its handler as a callable that mypy and a dead-code finder can follow; the app and the OpenAPI
document (``_openapi``) are both made from it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel

# An unbound handler of the API: ``Api.ping`` and alike, bound to the running service by build_app.
Handler = Callable[[Any, web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Handler
    request: type[BaseModel] | None
    response: type[BaseModel] | None

    @property
    def operation_id(self) -> str:
        """The handler's own name: what the OpenAPI document calls the route."""
        return self.handler.__name__
