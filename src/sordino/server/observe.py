"""Observability endpoints: the telemetry snapshot, the journal, profiling, the dashboard.

``GET  /v2/sordino/telemetry`` live figures and series (``sordino monitor``, /dashboard)
``GET  /v2/sordino/journal``   a time window of the journal (``sordino diagnose --url``)
``POST /v2/sordino/profile``   profile a model's operators (``sordino profile``)
``GET  /dashboard``            the web dashboard; its assets under ``/dashboard/static/``
``GET  /dashboard/playground`` the generation playground (prompt -> steps -> image)

The journal and profiling are protected endpoints (:class:`AdminAccess`): the journal's
event payloads hold worker PIDs and file paths, and a profile runs the model. The
telemetry snapshot is open, so the dashboard and ``sordino monitor`` work without a
token, but a caller the admin rule does not let in gets the public view: no worker PIDs,
no arena segment name, no journal path, and file paths in causes replaced by ``<path>``
(``"view": "public"``; ``"full"`` otherwise).

The dashboard's chart library is vendored in ``server/static`` (no CDN): the page
works on a machine without internet access.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import time
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.backends.base import dummy_inputs
from sordino.control.admin import AdminAccess
from sordino.control.profiling import profile_model
from sordino.errors import InvalidRequest, NotFound, SordinoError
from sordino.protocol.encode import encode_json
from sordino.records import MemoryStatistics
from sordino.server.runtime import Runtime
from sordino.telemetry.journal_reader import JournalReader, MissingJournal
from sordino.telemetry.snapshot import snapshot

__all__ = ["observe_routes", "public_view"]

MAX_PROFILE_S = 300.0
_STATIC_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".txt": "text/plain; charset=utf-8",
}


def _number(request: Request, name: str, default: float, low: float, high: float) -> float:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise InvalidRequest(f"query parameter {name!r} must be a number, got {raw!r}") from None
    if not low <= value <= high:
        raise InvalidRequest(f"query parameter {name!r} must be between {low:g} and {high:g}")
    return value


def _json(obj: object) -> Response:
    return Response(encode_json(obj), media_type="application/json")


def _static(name: str) -> bytes | None:
    root = resources.files("sordino.server").joinpath("static")
    if "/" in name or name.startswith("."):
        return None
    item = root.joinpath(name)
    return item.read_bytes() if item.is_file() else None


# An absolute or home-relative path (POSIX or Windows) inside a message.
_PATH = re.compile(r"""(?<![\w:/.])(?:~|[A-Za-z]:\\|/)[^\s'"(),;]*""")


def _without_paths(text: str) -> str:
    return _PATH.sub("<path>", text)


def public_view(document: dict[str, Any]) -> dict[str, Any]:
    """The telemetry snapshot without the internals (modified in place and returned)."""
    workers = document.get("workers") or {}
    for worker in workers.get("workers", ()):
        worker.pop("pid", None)
        worker["last_cause"] = _without_paths(worker.get("last_cause") or "")
    if isinstance(workers.get("arena"), dict):
        workers["arena"].pop("name", None)
    for event in document.get("events", ()):
        event["cause"] = _without_paths(event.get("cause") or "")
    if isinstance(document.get("journal"), dict):
        document["journal"].pop("path", None)
    if isinstance(document.get("satisfaction"), dict):
        document["satisfaction"].pop("tags", None)  # clients' own labels: theirs to read
    document["view"] = "public"
    return document


def memory_summary(stats: MemoryStatistics) -> dict[str, Any]:
    """The memory manager in a few figures, for the monitor (no tenant names)."""
    last = stats.last_defrag
    return {
        "strategy": stats.strategy,
        "defrag_runs": stats.defrag_runs,
        "defrag_bytes_moved": stats.defrag_bytes_moved,
        "last_pause_s": last.pause_s if last is not None else None,
        "overflow_shrinks": stats.overflow_shrinks,
        "overflow_rejections": stats.overflow_rejections,
        "quota_rejections": sum(o.rejections for o in stats.owners),
        "pool_bytes": stats.pool.capacity_bytes if stats.pool is not None else None,
        "pool_auto": stats.pool.auto if stats.pool is not None else False,
        "pool_resizes": stats.pool.resizes if stats.pool is not None else 0,
    }


def observe_routes(runtime: Runtime, guard: Any, access: AdminAccess) -> list[Route]:
    """The routes above; ``guard`` maps :class:`SordinoError` to error responses."""
    telemetry = runtime.telemetry
    window = int(runtime.config.telemetry.recent_window)

    async def live(request: Request) -> Response:
        seconds = int(_number(request, "seconds", 300, 1, window))
        events = int(_number(request, "events", 50, 0, 1000))
        execution = runtime.executor.statistics()
        document = snapshot(telemetry, seconds=seconds, events=events, execution=execution)
        document["memory"] = memory_summary(runtime.memory.statistics())
        # Tenants: an admin (or a server without keys) sees every one, a tenant itself only.
        tenants = [dataclasses.asdict(s) for s in runtime.tenants.statistics()]
        if runtime.tenants.enabled and not runtime.tenants.is_admin(
            request.headers.get("authorization")
        ):
            try:
                own = runtime.tenants.authenticate(request.headers.get("authorization"))
            except SordinoError:
                own = None
            tenants = [t for t in tenants if t["tenant"] == own]
        document["tenants"] = tenants
        if access.allows_request(request):
            document["view"] = "full"
        else:
            public_view(document)
        return _json(document)

    async def journal(request: Request) -> Response:
        now = time.time()
        end = _number(request, "end", now, 0, 1e12)
        start = _number(request, "start", end - 3600, 0, end)
        if telemetry.journal is None:
            raise NotFound(
                "this server keeps no journal: start it with --data-dir and telemetry.journal: true"
            )
        path = telemetry.journal.path

        def read() -> dict[str, Any]:
            try:
                with JournalReader(path) as reader:
                    return reader.window(start, end).to_json()
            except MissingJournal as exc:
                raise NotFound(str(exc)) from exc

        return _json(await asyncio.get_running_loop().run_in_executor(None, read))

    async def profile(request: Request) -> Response:
        try:
            body = json.loads(await request.body() or b"{}")
        except ValueError as exc:
            raise InvalidRequest(f"the profile request body is not JSON: {exc}") from None
        if not isinstance(body, dict) or not isinstance(body.get("model"), str):
            raise InvalidRequest('send {"model": NAME, "seconds": N} (version optional)')
        seconds = body.get("seconds", 10)
        if not isinstance(seconds, int | float) or not 0 < seconds <= MAX_PROFILE_S:
            raise InvalidRequest(f"seconds must be a number in (0, {MAX_PROFILE_S:g}]")
        model = runtime.get(body["model"], body.get("version"))
        result = await profile_model(
            model.key,
            executor=runtime.executor,
            seconds=float(seconds),
            synthetic_batch=lambda: dummy_inputs(model.metadata, 1),
        )
        telemetry.record_profile(result)
        return _json(result.to_json())

    async def dashboard(request: Request) -> Response:
        page = _static("dashboard.html")
        assert page is not None, "sordino/server/static/dashboard.html is missing"
        return Response(page, media_type=_STATIC_TYPES[".html"])

    async def playground(request: Request) -> Response:
        page = _static("playground.html")
        assert page is not None, "sordino/server/static/playground.html is missing"
        return Response(page, media_type=_STATIC_TYPES[".html"])

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        data = _static(name)
        if data is None:
            raise NotFound(f"no dashboard asset {name!r}")
        suffix = name[name.rfind(".") :]
        return Response(
            data,
            media_type=_STATIC_TYPES.get(suffix, "application/octet-stream"),
            headers={"Cache-Control": "max-age=3600"},
        )

    return [
        Route("/v2/sordino/telemetry", guard(live), methods=["GET"]),
        Route("/v2/sordino/journal", guard(access.protect(journal)), methods=["GET"]),
        Route("/v2/sordino/profile", guard(access.protect(profile)), methods=["POST"]),
        Route("/dashboard", guard(dashboard), methods=["GET"]),
        Route("/dashboard/playground", guard(playground), methods=["GET"]),
        Route("/dashboard/static/{name}", guard(static), methods=["GET"]),
    ]
