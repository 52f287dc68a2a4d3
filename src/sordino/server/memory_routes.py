"""HTTP endpoints of the memory manager.

- ``GET /v2/sordino/memory``: the arena, its tiers, owners and quotas, overflow
  protection and defragmentation figures (:class:`~sordino.records.MemoryStatistics`
  as JSON); what ``sordino memory status`` shows.
- ``POST /v2/sordino/memory/defrag``: defragment now; answers the run's
  :class:`~sordino.records.DefragReport`. A protected endpoint (the admin token, as
  for model control); what ``sordino memory defrag`` calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.control.admin import AdminAccess
from sordino.server.runtime import Runtime

__all__ = ["memory_routes"]

Handler = Callable[[Request], Awaitable[Response]]


def _json(obj: Any) -> Response:
    return Response(orjson.dumps(obj), media_type="application/json")


def memory_routes(
    runtime: Runtime, guard: Callable[[Handler], Handler], access: AdminAccess
) -> list[Route]:
    """The memory routes; ``guard`` maps errors as ``http.py`` does."""

    async def status(request: Request) -> Response:
        document = dataclasses.asdict(runtime.memory.statistics())
        document["config"] = runtime.config.memory.model_dump(mode="json")
        return _json(document)

    async def defrag(request: Request) -> Response:
        report = await runtime.memory.defragment("manual")
        return _json(dataclasses.asdict(report))

    return [
        Route("/v2/sordino/memory", guard(status), methods=["GET"]),
        Route("/v2/sordino/memory/defrag", guard(access.protect(defrag)), methods=["POST"]),
    ]
