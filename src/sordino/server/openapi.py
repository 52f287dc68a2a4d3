"""``GET /v2/openapi.json``: the HTTP API as OpenAPI 3.1, generated from the routes.

The document is built from the same route table the server dispatches on (every
Starlette route, and the inference fast path), so an endpoint cannot be served without
being listed: path parameters come from the route's path, methods from the route,
the summary from the handler's docstring. The KServe v2 inference request body has a
JSON schema; other bodies are described as JSON objects. Endpoints are behind a
bearer key where the server says so (see docs/security.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from starlette.routing import Route

from sordino import __version__

__all__ = ["INFER_REQUEST_SCHEMA", "openapi_document"]

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
INFER_PATHS = ("/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer")


def _operation(path: str, method: str, summary: str, infer: bool) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "operationId": f"{method}{re.sub(r'[^A-Za-z0-9]+', '_', path)}",
        "summary": summary,
        "parameters": [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _PARAM.findall(path)
        ],
        "responses": {"200": {"description": "success"}, "4XX": _ERROR, "5XX": _ERROR},
    }
    if method in ("post", "patch"):
        schema = INFER_REQUEST_SCHEMA if infer else {"type": "object"}
        operation["requestBody"] = {
            "required": infer,
            "content": {"application/json": {"schema": schema}},
        }
    return operation


def openapi_document(routes: Iterable[Route]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``routes`` and the inference fast path."""
    paths: dict[str, dict[str, Any]] = {}
    for path in INFER_PATHS:
        paths[path] = {"post": _operation(path, "post", "KServe v2 inference", True)}
    for route in routes:
        doc = (route.endpoint.__doc__ or "").strip().splitlines()
        summary = doc[0] if doc else route.path
        for method in sorted(route.methods or ()):
            if method == "HEAD":
                continue
            entry = paths.setdefault(route.path, {})
            entry[method.lower()] = _operation(route.path, method.lower(), summary, False)
    return {
        "openapi": "3.1.0",
        "info": {"title": "sordino", "version": __version__},
        "paths": paths,
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{}, {"bearer": []}],
    }
