"""The inference fast path: ``POST …/infer`` answered without Starlette.

:func:`answer_infer` is the whole request: body, authentication, one model lookup,
decode, the service, encode. The server's own HTTP protocol (``server/http_protocol.py``)
calls it straight from the parsed request and writes its answer in one write; the
ASGI wrapper :func:`with_fast_infer` calls it for any other ASGI server. Every other
endpoint goes through Starlette. Inference is the one endpoint on the hot
path, and at small tensor sizes Starlette's router, middleware stack and
Request/Response objects cost more than decoding the request (the profile is in
``docs/benchmarks.md``). The semantics are those of a Starlette handler: the same
errors and statuses, the same headers, and the queued request is cancelled when the
client disconnects.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol, TypeVar

from starlette.types import ASGIApp, Receive, Scope, Send

from sordino.errors import Cancelled, MalformedBody, SordinoError
from sordino.protocol.codec import (
    decode_infer_request,
    encode_error,
    encode_infer_response,
    parse_header_length,
)
from sordino.protocol.status import http_status, retry_after_header
from sordino.server.connection_guard import RECEIVED
from sordino.server.disconnect import until_disconnect
from sordino.server.inference_parts import InferenceParts
from sordino.server.runtime import Runtime
from sordino.server.service import request_tenant

__all__ = [
    "INFER_PATH",
    "BodyReader",
    "Watch",
    "answer_infer",
    "check_declared",
    "error_parts",
    "too_large",
    "with_fast_infer",
]

T = TypeVar("T")

log = logging.getLogger("sordino.http")

INFER_PATH = re.compile(r"/v2/models/(?P<model>[^/]+)(?:/versions/(?P<version>[^/]+))?/infer")
_FORWARDED = {
    b"x-sordino-tag": "x-sordino-tag",
    b"x-sordino-priority": "x-sordino-priority",
    b"x-sordino-timeout": "x-sordino-timeout",
    b"x-sordino-tenant": "x-sordino-tenant",
    b"authorization": "authorization",  # the API key: the service authenticates it
}
_JSON = b"application/json"


def error_parts(error: SordinoError) -> tuple[int, bytes, dict[str, str]]:
    """Return the status, ``{"error": ...}`` body and headers that answer ``error``.

    Client mistakes and back-pressure are logged at debug level, never as errors.
    """
    status = http_status(error)
    headers = {"Content-Type": "application/json"}
    retry = retry_after_header(error)
    if retry is not None:
        headers["Retry-After"] = retry
    level = logging.ERROR if status >= 500 and status != 503 else logging.DEBUG
    log.log(level, "%s %s", status, error)
    return status, encode_error(str(error)), headers


class Watch(Protocol):
    """Runs the service's work; raises Cancelled if the client leaves before it ends."""

    def __call__(self, work: Awaitable[T]) -> Awaitable[T]: ...


BodyReader = Callable[[], Awaitable[bytes]]
"""Reads the whole request body (after :func:`check_declared`); raises MalformedBody
past the limit, Cancelled when the client disconnects while sending it."""


def with_fast_infer(app: ASGIApp, parts: InferenceParts) -> ASGIApp:
    """Wrap ``app`` so inference requests skip its router and middleware.

    The server answers inference on its own protocol (``server/http_protocol.py``);
    this keeps the ASGI app whole for any other ASGI server or in-process client.
    """
    limit = parts.max_request_size

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            match = INFER_PATH.fullmatch(scope["path"])
            if match is not None:
                if scope["method"] == "POST":

                    def watch(work: Awaitable[T]) -> Awaitable[T]:
                        return until_disconnect(receive, work)

                    async def read() -> bytes:
                        return await _read_body(receive, limit)

                    client = scope.get("client")
                    received = scope.get("extensions", {}).get(RECEIVED)
                    status, payload, headers = await answer_infer(
                        parts,
                        match["model"],
                        match["version"],
                        scope["headers"],
                        read,
                        watch,
                        client=str(client[0]) if client else None,
                        received_at=received["at"] if received is not None else None,
                        path=scope["path"],
                    )
                    await _send(send, status, payload, headers)
                else:
                    message = f"{scope['method']} is not allowed on {scope['path']}; use POST"
                    await _send(send, 405, encode_error(message), {"Allow": "POST"})
                return
        await app(scope, receive, send)

    return asgi


async def answer_infer(
    parts: InferenceParts | Runtime,
    model: str,
    version: str | None,
    raw_headers: Iterable[tuple[bytes, bytes]],
    read_body: BodyReader,
    watch: Watch,
    *,
    client: str | None,
    received_at: float | None,
    path: str,
) -> tuple[int, bytes, dict[str, str]]:
    """Answer one ``POST …/infer``: its status, body and headers (names as written).

    Transport-neutral: ``raw_headers`` are the request's (names in lower case),
    ``read_body`` reads the body, ``watch`` runs the service's work so that a client
    that leaves cancels it. Every outcome is an answer: errors are ``{"error": …}``.
    ``parts`` are the runtime's parts a request uses (``Runtime.inference``; a
    :class:`Runtime` is taken for its ``inference``).
    """
    if not isinstance(parts, InferenceParts):
        parts = parts.inference
    service = parts.service
    limit = parts.max_request_size
    declared: bytes | None = None
    header_length: bytes | None = None
    forwarded: dict[str, str] = {}
    for name, value in raw_headers:
        if name == b"content-length":
            declared = value
        elif name == b"inference-header-content-length":
            header_length = value
        elif name in _FORWARDED:
            forwarded[_FORWARDED[name]] = value.decode("latin-1")
    headers: dict[str, str]
    cache_key: tuple[str, str, bytes] | None = None
    try:
        # Whatever ends the request before the service has it is counted there.
        with service.receiving(model, version, forwarded.get("x-sordino-tenant")):
            check_declared(limit, declared)
            arrived = time.perf_counter()
            body = await read_body()
            read_s = time.perf_counter() - arrived
            tenants = parts.tenants
            tenant: str | None = None  # authenticated here at most once a request
            if tenants.required:
                # No key, no answer: which models exist is not told to strangers.
                tenant = tenants.authenticate(forwarded.get("authorization"))
            # An unknown model is answered 404 whatever the body holds, as Triton does; the
            # model's shapes then bound what the body may declare, before anything is built.
            # The one lookup of the request: the service takes the route from here.
            route = parts.registry.route(model, version)
            parts.timings.body_read(route.key, read_s)
            cache = parts.result_cache
            if cache.active(model):
                if tenants.enabled and tenant is None:
                    # A cached answer is no way around the key, nor another tenant's result.
                    tenant = tenants.authenticate(forwarded.get("authorization"))
                cache_key = cache.key(
                    model, version, body, header_length, (tenant or "") if tenants.enabled else ""
                )
                cached = cache.get(cache_key)
                if cached is not None:
                    return 200, cached.payload, dict(cached.headers)
            request = decode_infer_request(
                body,
                model=model,
                version=version,
                header_length=parse_header_length(
                    header_length.decode("latin-1") if header_length is not None else None
                ),
                headers=forwarded or None,
                metadata=route.metadata,
                max_batch_size=route.max_batch_size,
            )
            if client:
                request.client = client
            if received_at is not None:
                request.received_at = received_at
            if tenant is not None and tenants.enabled:
                service.tenant_of(request, known=tenant)
            shared = parts.shared_memory.uses(request)
            if shared:
                parts.shared_memory.attach(request, service.tenant_of(request))
        response = await watch(service.infer(request, route))
        try:
            if shared:
                parts.shared_memory.write_outputs(request, response, request_tenant(request))
            payload, headers = encode_infer_response(response, request)
        finally:
            response.release()
        status = 200
        if cache_key is not None and not shared:
            cache.put(cache_key, payload, headers)
    except SordinoError as exc:
        status, payload, headers = error_parts(exc)
    except Exception as exc:  # a defect: answered as JSON like any error, and logged
        log.exception("inference request to %s failed", path)
        status, payload = 500, encode_error(f"internal error: {type(exc).__name__}")
        headers = {"Content-Type": "application/json"}
    if parts.registry.stopping:
        # Tell keep-alive clients to reconnect elsewhere rather than reuse a connection
        # the server is about to close.
        headers["Connection"] = "close"
    return status, payload, headers


async def _send(send: Send, status: int, payload: bytes, headers: dict[str, str]) -> None:
    raw = [(b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    if "Content-Type" not in headers:
        raw.append((b"content-type", _JSON))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


def too_large(limit: int) -> MalformedBody:
    """The error of a body past ``server.max_request_size``."""
    return MalformedBody(
        f"the request body is larger than the limit of {limit} bytes; send less data per "
        "request or raise server.max_request_size",
        too_large=True,
    )


def check_declared(limit: int, declared: bytes | None) -> None:
    """Raise :func:`too_large` if the ``Content-Length`` declares more than ``limit``."""
    # More digits than any limit has is too large without asking int() (and its digit cap).
    if (
        declared is not None
        and declared.isdigit()
        and (len(declared) > 18 or int(declared) > limit)
    ):
        raise too_large(limit)


async def _read_body(receive: Receive, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Cancelled("the client disconnected while sending the request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
