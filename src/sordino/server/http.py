"""The KServe v2 HTTP/REST endpoints (and Triton's config and statistics extensions).

Handlers are thin: read the body, decode, call the runtime, encode. Every error is a
:class:`SordinoError` mapped to a status by ``protocol/status.py`` and answered as
``{"error": "..."}``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino import __version__
from sordino.control.admin import admin_routes, admin_token
from sordino.errors import MalformedBody, ModelNotReady, SordinoError
from sordino.protocol.codec import (
    HEADER_CONTENT_LENGTH,
    decode_infer_request,
    encode_error,
    encode_infer_response,
    encode_json,
    parse_header_length,
)
from sordino.protocol.status import http_status, retry_after_header
from sordino.server.disconnect import until_disconnect
from sordino.server.http_routes import extra_routes
from sordino.server.model_config import model_metadata_json, triton_config_json
from sordino.server.model_control import ModelControl
from sordino.server.observe import observe_routes
from sordino.server.runtime import Runtime

__all__ = ["EXTENSIONS", "build_app"]

log = logging.getLogger("sordino.http")

EXTENSIONS = [
    "binary_tensor_data",
    "model_configuration",
    "statistics",
    "schedule_policy",
    "parameters",
    "model_repository",
    "generate",
]
JSON = "application/json"
Handler = Callable[[Request], Awaitable[Response]]


def _json(obj: object, status: int = 200) -> Response:
    return Response(encode_json(obj), status_code=status, media_type=JSON)


def _error(exc: SordinoError) -> Response:
    status = http_status(exc)
    headers = {}
    retry = retry_after_header(exc)
    if retry is not None:
        headers["Retry-After"] = retry
    # Client mistakes and back-pressure are not server errors: keep them out of the error log.
    level = logging.ERROR if status >= 500 and status != 503 else logging.DEBUG
    log.log(level, "%s %s", status, exc)
    return Response(encode_error(str(exc)), status_code=status, media_type=JSON, headers=headers)


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


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    too_large = MalformedBody(
        f"the request body is larger than the limit of {limit} bytes; send less data per "
        "request or raise server.max_request_size",
        too_large=True,
    )
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def build_app(runtime: Runtime, control: ModelControl | None = None) -> Starlette:
    """Return the ASGI application serving ``runtime`` (and ``control``'s repository API)."""
    limit = runtime.config.server.max_request_size
    control = control or ModelControl(runtime)

    async def server_metadata(request: Request) -> Response:
        return _json({"name": "sordino", "version": __version__, "extensions": EXTENSIONS})

    async def live(request: Request) -> Response:
        return Response(status_code=200)

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if runtime.ready else 503)

    async def model_metadata(request: Request) -> Response:
        name, version = _model_params(request)
        model = runtime.get(name, version)
        return _json(model_metadata_json(model, runtime.versions(name)))

    async def model_ready(request: Request) -> Response:
        name, version = _model_params(request)
        runtime.get(name, version)
        if not runtime.ready:
            raise ModelNotReady(f"model {name!r} is not ready: the server is not serving")
        return Response(status_code=200)

    async def model_config(request: Request) -> Response:
        name, version = _model_params(request)
        return _json(triton_config_json(runtime.get(name, version)))

    async def model_stats(request: Request) -> Response:
        name, version = _model_params(request)
        return _json(runtime.triton_statistics(name, version))

    async def all_stats(request: Request) -> Response:
        return _json(runtime.triton_statistics())

    async def infer(request: Request) -> Response:
        name, version = _model_params(request)
        body = await _read_body(request, limit)
        decoded = decode_infer_request(
            body,
            model=name,
            version=version,
            header_length=parse_header_length(request.headers.get(HEADER_CONTENT_LENGTH)),
            headers={
                name: value
                for name in ("x-sordino-tag", "x-sordino-tenant")
                if (value := request.headers.get(name)) is not None
            }
            or None,
        )
        response = await until_disconnect(request, runtime.infer(decoded))
        payload, headers = encode_infer_response(response, decoded)
        return Response(payload, headers=headers)

    async def metrics(request: Request) -> Response:
        return Response(
            runtime.metrics.exposition(), media_type="text/plain; version=0.0.4; charset=utf-8"
        )

    routes: list[Route] = [
        Route("/v2", _guard(runtime, server_metadata), methods=["GET"]),
        Route("/v2/health/live", _guard(runtime, live), methods=["GET"]),
        Route("/v2/health/ready", _guard(runtime, ready), methods=["GET"]),
        Route("/v2/models/stats", _guard(runtime, all_stats), methods=["GET"]),
        Route("/metrics", _guard(runtime, metrics), methods=["GET"]),
        *observe_routes(runtime, functools.partial(_guard, runtime)),
    ]
    token = admin_token(runtime.config.server.admin_token)
    routes += admin_routes(runtime.executor, runtime.clock, token)
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            Route(prefix, _guard(runtime, model_metadata), methods=["GET"]),
            Route(prefix + "/ready", _guard(runtime, model_ready), methods=["GET"]),
            Route(prefix + "/config", _guard(runtime, model_config), methods=["GET"]),
            Route(prefix + "/stats", _guard(runtime, model_stats), methods=["GET"]),
            Route(prefix + "/infer", _guard(runtime, infer), methods=["POST"]),
        ]
    routes += extra_routes(runtime, control, functools.partial(_guard, runtime), _json)

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
    return Starlette(routes=routes, exception_handlers=handlers)


def _model_params(request: Request) -> tuple[str, str | None]:
    params = request.path_params
    return params["model"], params.get("version")
