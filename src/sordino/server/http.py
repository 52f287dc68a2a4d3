"""The KServe v2 HTTP/REST endpoints (and Triton's config and statistics extensions).

Handlers are thin: read the body, decode, call the runtime, encode. Every error is a
:class:`SordinoError` mapped to a status by ``protocol/status.py`` and answered as
``{"error": "..."}``.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from sordino import __version__
from sordino.control.admin import AdminAccess, admin_routes
from sordino.errors import ModelNotReady, SordinoError
from sordino.protocol.encode import encode_error, encode_json
from sordino.server.auth import caller, me_routes, visible_metrics, with_authentication
from sordino.server.fast_infer import error_parts, with_fast_infer
from sordino.server.feedback_routes import feedback_routes
from sordino.server.guarding import guardian_routes, health_response, not_ready, server_ready
from sordino.server.http_routes import extra_routes
from sordino.server.log_settings import log_routes
from sordino.server.memory_routes import memory_routes
from sordino.server.model_config import model_metadata_json, triton_config_json
from sordino.server.model_control import ModelControl
from sordino.server.observe import observe_routes
from sordino.server.openapi import openapi_document
from sordino.server.reconfigure import Reconfigurer
from sordino.server.reconfigure_routes import reconfigure_routes
from sordino.server.runtime import Runtime
from sordino.server.shm_routes import shm_routes
from sordino.server.tenant_routes import tenant_routes
from sordino.server.tracing import trace_routes

__all__ = ["EXTENSIONS", "build_app"]

EXTENSIONS = [
    "binary_tensor_data",
    "model_configuration",
    "statistics",
    "schedule_policy",
    "parameters",
    "model_repository",
    "model_repository(unload_dependents)",
    "logging",
    "trace",
    "generate",
    "system_shared_memory",
    "classification",
    "sequence",
]
JSON = "application/json"
Handler = Callable[[Request], Awaitable[Response]]


def _json(obj: object, status: int = 200) -> Response:
    return Response(encode_json(obj), status_code=status, media_type=JSON)


def _error(exc: SordinoError) -> Response:
    status, body, headers = error_parts(exc)
    return Response(body, status_code=status, headers=headers)


def _guard(runtime: Runtime, handler: Handler) -> Handler:
    async def guarded(request: Request) -> Response:
        try:
            response = await handler(request)
        except SordinoError as exc:
            response = _error(exc)
        if runtime.stopping:
            # Tell keep-alive clients to reconnect elsewhere rather than reuse a connection
            # the server is about to close.
            response.headers["Connection"] = "close"
        return response

    return guarded


def build_app(runtime: Runtime, control: ModelControl | None = None) -> ASGIApp:
    """Return the ASGI application serving ``runtime`` (and ``control``'s repository API).

    Inference requests take the fast path (``server/fast_infer.py``); every other
    endpoint is a Starlette route below.
    """
    control = control or ModelControl(runtime)
    access = AdminAccess.from_config(
        runtime.config.server, runtime.config.auth, runtime.tenants.is_tenant_key
    )

    async def server_metadata(request: Request) -> Response:
        return _json({"name": "sordino", "version": __version__, "extensions": EXTENSIONS})

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        if "deep" in request.query_params:
            return await health_response(runtime, request)
        # Not ready while a loaded model cannot serve (all restarting, or wedged) or says
        # it is not ready (a Python model's is_ready()).
        return Response(status_code=200 if await server_ready(runtime) else 503)

    async def model_metadata(request: Request) -> Response:
        name, version = _model_params(request)
        model = runtime.get(name, version)
        return _json(model_metadata_json(model, runtime.versions(name)))

    async def model_ready(request: Request) -> Response:
        name, version = _model_params(request)
        model = runtime.get(name, version)
        if not runtime.ready:
            raise ModelNotReady(
                f"Request for unknown model: '{name}' is not at ready state (sordino: "
                "the server is not serving)"
            )
        why = (await not_ready(runtime, [model.key])).get(str(model.key))
        if why is not None:
            raise ModelNotReady(
                f"Request for unknown model: '{name}' is not at ready state (sordino: {why})"
            )
        return Response(status_code=200)

    async def model_config(request: Request) -> Response:
        name, version = _model_params(request)
        return _json(triton_config_json(runtime.get(name, version)))

    async def model_stats(request: Request) -> Response:
        name, version = _model_params(request)
        return _json(runtime.triton_statistics(name, version))

    async def all_stats(request: Request) -> Response:
        return _json(runtime.triton_statistics())

    async def metrics(request: Request) -> Response:
        # A tenant's key reads its own tenant's series only (server/auth.py).
        exposition = visible_metrics(runtime.metrics.exposition(), caller(runtime, request))
        return Response(exposition, media_type="text/plain; version=0.0.4; charset=utf-8")

    routes: list[Route] = [
        Route("/v2", _guard(runtime, server_metadata), methods=["GET"]),
        Route("/v2/health/live", _guard(runtime, live), methods=["GET"]),
        Route("/v2/health/ready", _guard(runtime, ready), methods=["GET"]),
        Route("/v2/models/stats", _guard(runtime, all_stats), methods=["GET"]),
        Route("/metrics", _guard(runtime, metrics), methods=["GET"]),
        *observe_routes(runtime, functools.partial(_guard, runtime), access),
    ]
    routes += admin_routes(
        runtime.executor, runtime.clock, access.token, access.keys, runtime.tenants.is_tenant_key
    )
    routes += memory_routes(runtime, functools.partial(_guard, runtime), access)
    routes += tenant_routes(runtime, functools.partial(_guard, runtime), access)
    routes += me_routes(runtime)
    routes += guardian_routes(runtime, functools.partial(_guard, runtime), access)
    routes += shm_routes(runtime, functools.partial(_guard, runtime))
    routes += log_routes(functools.partial(_guard, runtime), access.protect, runtime.executor)
    routes += trace_routes(
        runtime.service.tracer, functools.partial(_guard, runtime), access.protect
    )
    reconfigurer = Reconfigurer(runtime)
    routes += reconfigure_routes(reconfigurer, functools.partial(_guard, runtime), access)
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            Route(prefix, _guard(runtime, model_metadata), methods=["GET"]),
            Route(prefix + "/ready", _guard(runtime, model_ready), methods=["GET"]),
            Route(prefix + "/config", _guard(runtime, model_config), methods=["GET"]),
            Route(prefix + "/stats", _guard(runtime, model_stats), methods=["GET"]),
        ]
    routes += extra_routes(
        runtime.inference, control, functools.partial(_guard, runtime), _json, access
    )
    routes += feedback_routes(runtime, functools.partial(_guard, runtime), _json)

    async def openapi(request: Request) -> Response:
        """The HTTP API as OpenAPI 3.1 (generated from these routes)."""
        return _json(openapi_document(routes))

    routes.append(Route("/v2/openapi.json", _guard(runtime, openapi), methods=["GET"]))

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            message = f"no endpoint {request.url.path}; see GET /v2 for the protocol's endpoints"
        elif exc.status_code == 405:
            message = f"{request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return Response(encode_error(message), status_code=exc.status_code, media_type=JSON)

    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        HTTPException: http_error,
    }
    app = with_fast_infer(Starlette(routes=routes, exception_handlers=handlers), runtime.inference)
    return with_authentication(app, runtime)


def _model_params(request: Request) -> tuple[str, str | None]:
    params = request.path_params
    return params["model"], params.get("version")
