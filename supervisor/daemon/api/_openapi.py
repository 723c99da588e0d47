"""An OpenAPI 3.1 document generated from the route table and the protocol models."""

from __future__ import annotations

from typing import Any

import structlog

from supervisor import __version__
from supervisor.core import protocol
from supervisor.daemon.api._routes import Route

log = structlog.get_logger("supervise.api")


def openapi_schema(routes: list[Route]) -> dict[str, Any]:
    """An OpenAPI 3.1 document generated from the route table and the protocol models."""
    paths: dict[str, Any] = {}
    error_schema = protocol.ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas: dict[str, Any] = {**error_schema.pop("$defs", {}), "ErrorBody": error_schema}
    for route in routes:
        method, path = route.method, route.path
        operation: dict[str, Any] = {"operationId": route.operation_id, "responses": {
            "default": {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}}}}
        for model, slot in ((route.request, "request"), (route.response, "response")):
            if model is None:
                continue
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
            ref = {"content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}
            if slot == "request":
                operation["requestBody"] = ref
            else:
                operation["responses"]["200"] = {"description": "ok", **ref}
        params = [{"name": p, "in": "path", "required": True, "schema": {"type": "string"}}
                  for p in ("name",) if "{" + p + "}" in path]
        if params:
            operation["parameters"] = params
        paths.setdefault(path, {})[method.lower()] = operation
    return {"openapi": "3.1.0", "info": {"title": "supervise daemon", "version": __version__}, "paths": paths,
            "components": {"schemas": schemas}}
