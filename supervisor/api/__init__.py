"""The control API on the daemon's Unix socket.

    _handlers   one handler per route, the route table, build_app
    _http       the error map (errors.TABLE -> ErrorBody, status), request parsing, JSON answers
    _routes     the route table
    _service    what the handlers need of the running daemon (a Protocol)
    _openapi    the OpenAPI document, from the route table and the protocol models
"""

from ._handlers import Api, build_app
from ._http import REQUEST_TIMEOUT
from ._openapi import openapi_schema
from ._routes import ROUTES
from ._service import Service, WebControl

__all__ = ["REQUEST_TIMEOUT", "ROUTES", "Api", "Service", "WebControl", "build_app", "openapi_schema"]
