"""HTTP endpoints beyond plain inference: repository control and Triton's generate.

- ``POST /v2/repository/index``: every model the server knows and its state.
- ``POST /v2/repository/models/{m}/load`` and ``/unload``: model control.

  The three are protected endpoints (:class:`~sordino.control.admin.AdminAccess`): the
  admin token, or a loopback client of a loopback-bound server without a token.
- ``POST /v2/models/{m}[/versions/{v}]/generate``: one response as flat JSON.
- ``POST /v2/models/{m}[/versions/{v}]/generate_stream``: every response as a
  Server-Sent Event; an error after the first event is sent as ``data: {"error": ...}``.

Handlers are as thin as the KServe ones in ``http.py`` and share its error mapping.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.control.admin import AdminAccess
from sordino.errors import Cancelled, InvalidRequest, MalformedBody, SordinoError
from sordino.inference import InferRequest, InferResponse
from sordino.protocol.generate import (
    decode_generate_request,
    encode_generate_response,
    sse_event,
)
from sordino.server.disconnect import EventStream, until_disconnect
from sordino.server.inference_parts import InferenceParts
from sordino.server.model_control import ModelControl, load_parameters
from sordino.server.route import Route as ModelRoute

__all__ = ["OFF_LOOP_BYTES", "extra_routes", "json_body"]

OFF_LOOP_BYTES = 256 * 1024
"""Generate bodies larger than this are decoded on a thread, not on the event loop."""

Handler = Callable[[Request], Awaitable[Response]]


def extra_routes(
    parts: InferenceParts,
    control: ModelControl,
    guard: Callable[[Handler], Handler],
    json: Callable[[object], Response],
    access: AdminAccess,
) -> list[Route]:
    """Return the repository and generate routes; ``guard`` maps errors as ``http.py`` does.

    The repository routes are behind ``access``; the generate routes use ``parts``
    (``Runtime.inference``) and look the model up once a request.
    """
    service = parts.service

    async def index(request: Request) -> Response:
        body = await json_body(request)
        ready = body.get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidRequest("'ready' must be true or false")
        entries = control.index(ready_only=ready)
        # As Triton 2.51: a reason only where there is one (not for a READY model), a
        # model never loaded as its name alone.
        return json(
            [
                {"name": e.name}
                | ({"version": e.version} if e.version else {})
                | ({"state": e.state} if e.state else {})
                | ({"reason": e.reason} if e.reason else {})
                for e in entries
            ]
        )

    async def load(request: Request) -> Response:
        body = await json_body(request)
        parameters = body.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise InvalidRequest("'parameters' must be an object")
        await control.load(request.path_params["model"], load_parameters(parameters))
        return Response(status_code=200)

    async def unload(request: Request) -> Response:
        body = await json_body(request)
        parameters = body.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise InvalidRequest("'parameters' must be an object")
        dependents = parameters.get("unload_dependents", False)
        if not isinstance(dependents, bool):
            raise InvalidRequest("parameter 'unload_dependents' must be true or false")
        await control.unload(request.path_params["model"], unload_dependents=dependents)
        return Response(status_code=200)

    async def generate(request: Request) -> Response:
        decoded, route = await _generate_request(parts, request)
        response = await until_disconnect(request.receive, service.infer(decoded, route))
        try:
            return json(encode_generate_response(response, _binary(route)))
        finally:
            response.release()

    async def generate_stream(request: Request) -> Response:
        decoded, route = await _generate_request(parts, request)
        responses = service.responses(decoded, route)
        # Refusals (validation, admission) are answered with a status before streaming.
        try:
            first, _ = await until_disconnect(request.receive, anext(responses))
        except StopAsyncIteration:
            # A decoupled model that sent only its final flag: a stream of no events.
            return EventStream(_no_events())
        except BaseException:
            await responses.aclose()
            raise
        binary = _binary(route)
        if isinstance(first, SordinoError):  # the model's error response, not its last
            event = sse_event({"error": str(first)})
        else:
            try:
                event = sse_event(encode_generate_response(first, binary))
            finally:
                first.release()
        return EventStream(_events(event, responses, binary))

    routes = [
        Route("/v2/repository/index", guard(access.protect(index)), methods=["POST"]),
        Route("/v2/repository/models/{model}/load", guard(access.protect(load)), methods=["POST"]),
        Route(
            "/v2/repository/models/{model}/unload",
            guard(access.protect(unload)),
            methods=["POST"],
        ),
    ]
    for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
        routes += [
            Route(prefix + "/generate", guard(generate), methods=["POST"]),
            Route(prefix + "/generate_stream", guard(generate_stream), methods=["POST"]),
        ]
    return routes


async def json_body(request: Request) -> dict[str, Any]:
    """The request's body as a JSON object (``{}`` when empty); anything else is a 400."""
    body = await request.body()
    if not body.strip():
        return {}
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise MalformedBody(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise MalformedBody("the request body must be a JSON object")
    return document


async def _generate_request(
    parts: InferenceParts, request: Request
) -> tuple[InferRequest, ModelRoute]:
    """The decoded request and its route (the request's one model lookup)."""
    name = request.path_params["model"]
    version = request.path_params.get("version")
    # Whatever ends the request before the service has it is counted there.
    with parts.service.receiving(name, version, request.headers.get("x-sordino-tenant")):
        route = parts.registry.route(name, version)
        limit = parts.max_request_size
        try:
            body = await request.body()
        except ClientDisconnect:
            raise Cancelled("the client disconnected while sending the request") from None
        if len(body) > limit:
            raise MalformedBody(
                f"the request body is larger than the limit of {limit} bytes", too_large=True
            )
        decode = functools.partial(
            decode_generate_request, body, route.metadata, model=name, version=version
        )
        # A large body takes milliseconds per megabyte to decode: off the event loop, so
        # that other clients are not stalled meanwhile.
        decoded = await asyncio.to_thread(decode) if len(body) > OFF_LOOP_BYTES else decode()
    authorization = request.headers.get("authorization")
    if authorization is not None:
        decoded.headers["authorization"] = authorization  # the service authenticates it
    return decoded, route


def _binary(route: ModelRoute) -> tuple[str, ...]:
    """The BYTES outputs sent as base64 in generate JSON: an iterative model's PNG."""
    return ("png",) if route.way == "generate" else ()


async def _no_events() -> AsyncIterator[bytes]:
    return
    yield  # pragma: no cover  (an async generator that yields nothing)


async def _events(
    first: bytes,
    rest: AsyncGenerator[tuple[InferResponse | SordinoError, bool], None],
    binary: tuple[str, ...] = (),
) -> AsyncIterator[bytes]:
    yield first
    async with aclosing(rest):
        try:
            async for response, _ in rest:
                if isinstance(response, SordinoError):  # the model's, within its stream
                    yield sse_event({"error": str(response)})
                    continue
                try:
                    event = sse_event(encode_generate_response(response, binary))
                finally:
                    response.release()
                yield event
        except SordinoError as exc:
            yield sse_event({"error": str(exc)})
