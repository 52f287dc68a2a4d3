"""HTTP endpoints of Triton's shared-memory extensions.

- ``GET /v2/systemsharedmemory[/region/{name}]/status``: the caller's regions.
- ``POST /v2/systemsharedmemory/region/{name}/register`` with ``{"key", "offset",
  "byte_size"}``; ``POST /v2/systemsharedmemory[/region/{name}]/unregister``.
- ``/v2/cudasharedmemory/…``: answered 400 "not supported" (no GPU memory is served).

The caller's tenant (``x-sordino-tenant``, as for inference) owns its regions
(``server/shm.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.errors import InvalidRequest, Unsupported
from sordino.server.http_routes import json_body
from sordino.server.runtime import Runtime

__all__ = ["shm_routes"]

Handler = Callable[[Request], Awaitable[Response]]


def _json(obj: Any) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


def shm_routes(runtime: Runtime, guard: Callable[[Handler], Handler]) -> list[Route]:
    """The shared-memory routes; ``guard`` maps errors as ``http.py`` does."""
    regions = runtime.shared_memory

    def tenant(request: Request) -> str:
        return runtime.service.caller_tenant(dict(request.headers))

    async def status(request: Request) -> Response:
        return _json(regions.status(tenant(request), request.path_params.get("name")))

    async def register(request: Request) -> Response:
        body = await json_body(request)
        for key in ("key", "byte_size"):
            if key not in body:
                raise InvalidRequest(
                    f"the register request has no {key!r}; send "
                    '{"key": "/shm_key", "offset": 0, "byte_size": N}'
                )
        regions.register(
            tenant(request),
            request.path_params["name"],
            body["key"],
            body.get("offset", 0),
            body["byte_size"],
        )
        return Response(status_code=200)

    async def unregister(request: Request) -> Response:
        await json_body(request)
        regions.unregister(tenant(request), request.path_params.get("name"))
        return Response(status_code=200)

    async def cuda(request: Request) -> Response:
        raise Unsupported(
            "the CUDA shared-memory extension is not supported by sordino (it serves no GPU "
            "memory to clients); use /v2/systemsharedmemory or send tensors in the request"
        )

    system = "/v2/systemsharedmemory"
    routes = [
        Route(f"{system}/status", guard(status), methods=["GET"]),
        Route(f"{system}/region/{{name}}/status", guard(status), methods=["GET"]),
        Route(f"{system}/region/{{name}}/register", guard(register), methods=["POST"]),
        Route(f"{system}/unregister", guard(unregister), methods=["POST"]),
        Route(f"{system}/region/{{name}}/unregister", guard(unregister), methods=["POST"]),
    ]
    for path in ("/status", "/region/{name}/status"):
        routes.append(Route(f"/v2/cudasharedmemory{path}", guard(cuda), methods=["GET"]))
    for path in ("/region/{name}/register", "/unregister", "/region/{name}/unregister"):
        routes.append(Route(f"/v2/cudasharedmemory{path}", guard(cuda), methods=["POST"]))
    return routes
