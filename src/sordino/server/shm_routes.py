"""HTTP endpoints of Triton's shared-memory extensions.

- ``GET /v2/systemsharedmemory[/region/{name}]/status``: the caller's regions.
- ``POST /v2/systemsharedmemory/region/{name}/register`` with ``{"key", "offset",
  "byte_size"}``; ``POST /v2/systemsharedmemory[/region/{name}]/unregister``.
- ``/v2/cudasharedmemory/…``: answered as Triton does on a server without GPUs: status
  lists no regions, unregistering succeeds, registering is refused (400, "not supported:
  no CUDA devices"), so Triton's clients that first unregister every region work.

With tenants configured, the tenant the caller's API key names owns its regions;
without, every caller shares one set (``server/shm.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.errors import InvalidRequest
from sordino.server.http_routes import json_body
from sordino.server.runtime import Runtime
from sordino.server.shm import cuda_register, cuda_status

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

    # CUDA shared memory holds no state, but wants the same credentials as the rest.
    async def cuda_status_route(request: Request) -> Response:
        tenant(request)
        return _json(cuda_status(request.path_params.get("name")))

    async def cuda_register_route(request: Request) -> Response:
        tenant(request)
        await json_body(request)
        cuda_register(request.path_params["name"])

    async def cuda_unregister(request: Request) -> Response:
        tenant(request)
        await json_body(request)  # there are no CUDA regions: nothing to forget
        return Response(status_code=200)

    system = "/v2/systemsharedmemory"
    routes = [
        Route(f"{system}/status", guard(status), methods=["GET"]),
        Route(f"{system}/region/{{name}}/status", guard(status), methods=["GET"]),
        Route(f"{system}/region/{{name}}/register", guard(register), methods=["POST"]),
        Route(f"{system}/unregister", guard(unregister), methods=["POST"]),
        Route(f"{system}/region/{{name}}/unregister", guard(unregister), methods=["POST"]),
    ]
    cuda = "/v2/cudasharedmemory"
    routes += [
        Route(f"{cuda}/status", guard(cuda_status_route), methods=["GET"]),
        Route(f"{cuda}/region/{{name}}/status", guard(cuda_status_route), methods=["GET"]),
        Route(f"{cuda}/region/{{name}}/register", guard(cuda_register_route), methods=["POST"]),
        Route(f"{cuda}/unregister", guard(cuda_unregister), methods=["POST"]),
        Route(f"{cuda}/region/{{name}}/unregister", guard(cuda_unregister), methods=["POST"]),
    ]
    return routes
