"""The control API on the daemon's Unix socket.

    _handlers   one handler per route, the route table built from them, build_app
    _http       the error map (errors.TABLE -> ErrorBody, status), request parsing, JSON answers
    _routes     what a route is (method, path, handler, models)
    _service    what the handlers need of the running daemon (a Protocol)
    _openapi    the OpenAPI document, from the route table and the protocol models
"""

from supervisor.daemon.api._handlers import ROUTES, Api, build_app
from supervisor.daemon.api._http import REQUEST_TIMEOUT
from supervisor.daemon.api._openapi import openapi_schema
from supervisor.daemon.api._routes import Handler, Route
from supervisor.daemon.api._service import Service, WebControl

__all__ = ["REQUEST_TIMEOUT", "ROUTES", "Api", "Handler", "Route", "Service", "WebControl", "build_app", "openapi_schema"]
