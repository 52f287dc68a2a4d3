"""``GET /v2/openapi.json``: the HTTP API as OpenAPI 3.1, generated from the routes.

The document is built from the same route table the server dispatches on (every
Starlette route, and the inference fast path), so an endpoint cannot be served without
being listed: path parameters come from the route's path, methods from the route,
the summary from the handler's docstring. The KServe v2 inference request body has a
JSON schema; a handler registered with :func:`documented` publishes the JSON schema of
the pydantic model it validates its body with (and its success status); other bodies
are described as JSON objects. The error statuses are the ones ``protocol/status.py``
maps sordino's errors to. Endpoints are behind a bearer key where the server says so
(see docs/security.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel
from starlette.routing import Route

from sordino import __version__

__all__ = ["ERROR_STATUSES", "INFER_REQUEST_SCHEMA", "documented", "openapi_document"]

H = TypeVar("H", bound=Callable[..., Any])

_PARAM = re.compile(r"{([^}:]+)(?::[^}]+)?}")

INFER_REQUEST_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["inputs"],
    "properties": {
        "id": {"type": "string"},
        "parameters": {"type": "object"},
        "inputs": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "shape", "datatype"],
                "properties": {
                    "name": {"type": "string"},
                    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
                    "datatype": {"type": "string"},
                    "parameters": {"type": "object"},
                    "data": {"type": "array"},
                },
            },
        },
        "outputs": {
            "type": "array",
            "items": {"type": "object", "properties": {"name": {"type": "string"}}},
        },
    },
}
_ERROR = {
    "description": "an error",
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"error": {"type": "string"}}}
        }
    },
}
ERROR_STATUSES = ("400", "401", "403", "404", "408", "413", "429", "500", "503")
"""What a request can be answered besides success: ``protocol/status.py``'s mapping of
sordino's errors, 408 (a body too slow, server/guarded_reads.py) and 413."""


@dataclass(frozen=True, slots=True)
class _Notes:
    body: dict[str, Any] | None
    success: str


_NOTES: dict[Callable[..., Any], _Notes] = {}


def documented(
    handler: H,
    *,
    body: type[BaseModel] | None = None,
    only: Iterable[str] | None = None,
    success: int = 200,
) -> H:
    """Register what ``handler`` (a route's endpoint) takes and answers; return it.

    ``body``: the pydantic model the handler validates its JSON body with; ``only``
    keeps just those fields, none required (a partial update). ``success``: its status
    when it works (201 for a creation).
    """
    schema = None
    if body is not None:
        schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
        if only is not None:
            kept = set(only)
            schema["properties"] = {k: v for k, v in schema["properties"].items() if k in kept}
            schema.pop("required", None)
    _NOTES[handler] = _Notes(schema, str(success))
    return handler


INFER_PATHS = ("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer")


def _operation(
    path: str, method: str, summary: str, infer: bool, notes: _Notes | None = None
) -> dict[str, Any]:
    success = notes.success if notes is not None else "200"
    operation: dict[str, Any] = {
        "operationId": f"{method}{re.sub(r'[^A-Za-z0-9]+', '_', path)}",
        "summary": summary,
        "parameters": [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _PARAM.findall(path)
        ],
        "responses": {success: {"description": "success"}}
        | {status: _ERROR for status in ERROR_STATUSES},
    }
    if method in ("post", "patch"):
        schema: dict[str, Any] = {"type": "object"}
        if infer:
            schema = INFER_REQUEST_SCHEMA
        elif notes is not None and notes.body is not None:
            schema = {k: v for k, v in notes.body.items() if k != "$defs"}
        operation["requestBody"] = {
            "required": infer or (notes is not None and notes.body is not None),
            "content": {"application/json": {"schema": schema}},
        }
    return operation


def openapi_document(routes: Iterable[Route]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` and the inference fast path."""
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {}
    for path in INFER_PATHS:
        paths[path] = {"post": _operation(path, "post", "KServe v2 inference", True)}
    for route in routes:
        doc = (route.endpoint.__doc__ or "").strip().splitlines()
        summary = doc[0] if doc else route.path
        for method in sorted(route.methods or ()):
            if method == "HEAD":
                continue
            notes = _NOTES.get(route.endpoint)
            if notes is not None and notes.body is not None:
                schemas.update(notes.body.get("$defs", {}))
            entry = paths.setdefault(route.path, {})
            entry[method.lower()] = _operation(route.path, method.lower(), summary, False, notes)
    return {
        "openapi": "3.1.0",
        "info": {"title": "sordino", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{}, {"bearer": []}],
    }
