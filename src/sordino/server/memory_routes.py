"""HTTP endpoints of the memory manager.

- ``GET /v2/sordino/memory``: the arena, its tiers, owners and quotas, overflow
  protection and defragmentation figures (:class:`~sordino.records.MemoryStatistics`
  as JSON); what ``sordino memory status`` shows.
- ``POST /v2/sordino/memory/defrag``: defragment now; answers the run's
  :class:`~sordino.records.DefragReport`. A protected endpoint (the admin token, as
  for model control); what ``sordino memory defrag`` calls.
- ``POST /v2/sordino/memory/resize`` with ``{"size": "64MB"}``: replace the arena's
  segment by one of that size at the next quiet moment; answers the
  :class:`~sordino.records.ResizeReport`, or ``{"resized": false, "why": ...}``.
  Protected; what ``sordino memory resize`` calls.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.config.base import MAX_POOL_SIZE, MIN_POOL_SIZE
from sordino.config.units import parse_size
from sordino.control.admin import AdminAccess
from sordino.errors import ConfigError, InvalidRequest
from sordino.memory.resizing import shm_room
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

    async def resize(request: Request) -> Response:
        try:
            body = orjson.loads(await request.body() or b"{}")
            size = parse_size(body["size"]) if isinstance(body, dict) else None
        except (orjson.JSONDecodeError, KeyError, ConfigError) as exc:
            detail = exc.message if isinstance(exc, ConfigError) else 'a body {"size": "64MB"}'
            raise InvalidRequest(f"memory resize needs {detail}") from None
        if size is None or not MIN_POOL_SIZE <= size <= MAX_POOL_SIZE:
            raise InvalidRequest(
                f'memory resize needs {{"size": ...}} of at least {MIN_POOL_SIZE} bytes (64KB) '
                f"and at most {MAX_POOL_SIZE} (1TB)"
            )
        arena = runtime.memory.owner.existing()
        if arena is None:
            return _json({"resized": False, "why": "no arena yet (no model runs in a worker)"})
        if size // 4096 * 4096 == arena.capacity:
            return _json({"resized": False, "why": f"the arena is {arena.capacity} bytes already"})
        room = shm_room(arena)
        if room is not None and size > room:
            raise InvalidRequest(
                f"/dev/shm has room for an arena of at most {room} bytes, not {size}; "
                "free /dev/shm or ask for less"
            )
        live = arena.statistics().in_use_bytes
        if size < live:
            raise InvalidRequest(
                f"the arena holds {live} bytes now; it cannot shrink to {size} bytes"
            )
        report = await runtime.memory.resize(size, "manual")
        if report is None:
            return _json(
                {"resized": False, "why": "no quiet moment came, or the blocks did not fit"}
            )
        return _json({"resized": True, **dataclasses.asdict(report)})

    return [
        Route("/v2/sordino/memory/resize", guard(access.protect(resize)), methods=["POST"]),
        Route("/v2/sordino/memory", guard(status), methods=["GET"]),
        Route("/v2/sordino/memory/defrag", guard(access.protect(defrag)), methods=["POST"]),
    ]
