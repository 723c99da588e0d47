"""reference/api.md and reference/openapi.json: the control API, from the OpenAPI document the daemon
serves at /openapi.json (supervisor/daemon/api/_openapi.py, made from the route table) and, for what that
document does not carry, from the handlers' source (query parameters) and the app's router."""

from __future__ import annotations

import ast
import inspect
import json
import textwrap
from types import SimpleNamespace
from typing import Any

from .source import cell

_QUERY_READERS = {"_int_query"}  # _int_query(request, "name", ...)


def openapi() -> dict[str, Any]:
    from supervisor.daemon.api import ROUTES, openapi_schema

    return openapi_schema(ROUTES)


def openapi_json() -> str:
    return json.dumps(openapi(), indent=1, sort_keys=True) + "\n"


def query_parameters() -> dict[str, list[str]]:
    """handler name -> the query parameters it reads (request.query.get("x"), _int_query(request, "x"))."""
    from supervisor.daemon.api._handlers import Api

    tree = ast.parse(textwrap.dedent(inspect.getsource(Api)))
    methods = {n.name: n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    direct = {name: _reads(node) for name, node in methods.items()}
    calls = {name: {c.func.attr for c in ast.walk(node) if isinstance(c, ast.Call)
                    and isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name)
                    and c.func.value.id == "self" and c.func.attr in methods}
             for name, node in methods.items()}
    out: dict[str, list[str]] = {}
    for name in methods:
        seen, todo, keys = {name}, [name], []
        while todo:  # what the handler reads itself and through the methods it calls
            current = todo.pop()
            keys += [k for k in direct[current] if k not in keys]
            todo += [c for c in calls[current] if c not in seen]
            seen.update(calls[current])
        out[name] = keys
    return out


def _reads(node: ast.AST) -> list[str]:
    keys: list[str] = []
    for call in ast.walk(node):
        if not isinstance(call, ast.Call) or not call.args:
            continue
        func = call.func
        is_get = (isinstance(func, ast.Attribute) and func.attr == "get" and isinstance(func.value, ast.Attribute)
                  and func.value.attr == "query")
        is_reader = isinstance(func, ast.Name) and func.id in _QUERY_READERS and len(call.args) > 1
        arg = call.args[0] if is_get else call.args[1] if is_reader else None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value not in keys:
            keys.append(arg.value)
    return keys


def _extra_routes() -> list[tuple[str, str]]:
    """Routes the app serves beyond the route table (the OpenAPI document itself, /metrics)."""
    from supervisor.daemon.api import ROUTES, build_app

    app = build_app(SimpleNamespace(settings=SimpleNamespace(request_timeout_s=10.0)))  # type: ignore[arg-type]
    table = {(r.method, r.path) for r in ROUTES}
    out = []
    for route in app.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.method != "HEAD" and (route.method, path) not in table:
            out.append((route.method, path))
    return out


def _ref(schema: dict[str, Any] | None) -> str:
    if not schema:
        return ""
    ref = schema["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
    return f"[`{ref}`](#{ref.lower()})"


def _schema_type(prop: dict[str, Any] | bool) -> str:
    if not isinstance(prop, dict):
        return "any"
    if "$ref" in prop:
        name = prop["$ref"].rsplit("/", 1)[-1]
        return f"[`{name}`](#{name.lower()})"
    if "anyOf" in prop:
        return " or ".join(_schema_type(p) for p in prop["anyOf"])
    if "enum" in prop:
        return " \\| ".join(f"`{v}`" for v in prop["enum"])
    if prop.get("type") == "array":
        return "array of " + _schema_type(prop.get("items", {}))
    if prop.get("type") == "object" and "additionalProperties" in prop:
        return "object of " + _schema_type(prop["additionalProperties"])
    return prop.get("type", "any")


def _schemas(doc: dict[str, Any]) -> list[str]:
    out = ["## Schemas", ""]
    for name, schema in sorted(doc["components"]["schemas"].items()):
        out += [f"### {name}", ""]
        if schema.get("description"):
            out += [cell(schema["description"]), ""]
        if "enum" in schema:
            out += ["One of " + ", ".join(f"`{v}`" for v in schema["enum"]) + ".", ""]
            continue
        props = schema.get("properties", {})
        if props:
            required = set(schema.get("required", []))
            out += ["| field | type | required | what |", "|---|---|---|---|"]
            out += [f"| `{p}` | {_schema_type(s)} | {'yes' if p in required else ''} | {cell(s.get('description', ''))} |"
                    for p, s in props.items()]
            out.append("")
    return out


def render() -> str:
    doc = openapi()
    queries = query_parameters()
    out = ["# HTTP API", "",
           "Generated by `python docs/gen_reference.py` from the OpenAPI document the daemon serves",
           "(`GET /openapi.json`, built from the route table in `supervisor/daemon/api/_handlers.py` and the models in",
           "`supervisor/core/protocol.py`); the document itself is [openapi.json](openapi.json). Do not edit by hand.", "",
           "The API is HTTP/1.1 on the daemon's Unix socket, `$SUPERVISE_HOME/daemon.sock` (mode 0600): only the",
           "user who runs the daemon can reach it. Every route takes and returns JSON; an error is an",
           "[`ErrorBody`](#errorbody) with a non-2xx status, whose `exit_code` is what the CLI exits with",
           "([exit codes](exit-codes.md)). With `follow=1`, `events` and `log` answer newline-delimited JSON",
           "(`EventInfo`, `LogChunk`), one object a line, until the client hangs up.", "",
           "```sh",
           "curl --unix-socket ~/.local/state/supervise/daemon.sock http://x/v1/status",
           "curl --unix-socket ~/.local/state/supervise/daemon.sock 'http://x/v1/jobs/extract/events?follow=1'",
           "```", "",
           "## Routes", "",
           "Query parameters are not in the OpenAPI document; the column lists those each handler reads",
           "(from its source).", "",
           "| method | path | operation | query | request | response |", "|---|---|---|---|---|---|"]
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            query = ", ".join(f"`{q}`" for q in queries.get(op["operationId"], []))
            out.append(f"| {method.upper()} | `{path}` | `{op['operationId']}` | {query} | "
                       f"{_ref(op.get('requestBody'))} | {_ref(op['responses'].get('200'))} |")
    for method, path in _extra_routes():
        what = {"/openapi.json": "this API's OpenAPI 3.1 document",
                "/metrics": "Prometheus metrics, text format ([metrics](metrics.md))"}.get(path, "")
        out.append(f"| {method} | `{path}` | {what} | | | |")
    out += ["", *_schemas(doc)]
    return "\n".join(out).rstrip() + "\n"
