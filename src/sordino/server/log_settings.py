"""Triton's logging extension: read and change the server's logging while it runs.

``GET /v2/logging`` answers the settings; ``POST /v2/logging`` with some of them
changes those and answers all; the gRPC ``LogSettings`` RPC does both (an empty
request reads). The settings, as Triton 2.51 names them:

- ``log_info``, ``log_warning``, ``log_error`` (true/false): whether records of that
  severity are written;
- ``log_verbose_level`` (0 or more): above 0, debug records are written too (Triton's
  verbose logging);
- ``log_format``: ``default`` (sordino's ``TIME LEVEL LOGGER: MESSAGE``, local time) or
  ``ISO8601`` (the time as ``2026-12-06T04:48:24Z``, UTC);
- ``log_file``: where the log goes, ``""`` for standard error; it cannot be changed
  over the network (as on Triton: refused).

They apply to the server process's log (every logger, sordino's and its libraries'),
from the level ``sordino start --log-level`` set, and to the models' worker processes
(a Python model's ``pb_utils.Logger`` lines follow them, as on Triton): a worker starts
with the server's settings and is told of each change, as is a Ray actor. A setting
sordino does not know, or a value of the wrong type, is refused
with what to send (Triton ignores the one and answers the other 500). Who may call it
is the transports' business: like model control, it is a protected endpoint.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sordino.telemetry.log_settings import process_log_settings

__all__ = ["log_routes", "tell_workers"]

Handler = Callable[[Request], Awaitable[Response]]


async def tell_workers(executor: object, settings: dict[str, Any]) -> None:
    """The models' worker processes log as the server now does (``settings``); an
    executor without worker processes of its own (Ray's) is not told."""
    tell = getattr(executor, "tell_log", None)
    if tell is not None:
        await tell(settings)


def log_routes(
    guard: Callable[[Handler], Handler], protect: Callable[[Handler], Handler], executor: object
) -> list[Route]:
    """``GET`` and ``POST /v2/logging`` (``guard`` maps errors to answers, ``protect``
    puts a handler behind the admin check; a change reaches ``executor``'s workers)."""

    async def logging_settings(request: Request) -> Response:
        from sordino.server.http_routes import json_body

        settings = process_log_settings()
        if request.method == "GET":
            return JSONResponse(settings.current())
        now = settings.update(await json_body(request))
        await tell_workers(executor, now)
        return JSONResponse(now)

    return [Route("/v2/logging", guard(protect(logging_settings)), methods=["GET", "POST"])]
