"""The inference fast path: ``POST …/infer`` answered straight on ASGI.

Every other endpoint goes through Starlette. Inference is the one endpoint on the hot
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

from starlette.types import ASGIApp, Receive, Scope, Send

from sordino.errors import Cancelled, MalformedBody, SordinoError
from sordino.protocol.codec import (
    decode_infer_request,
    encode_error,
    encode_infer_response,
    parse_header_length,
)
from sordino.protocol.status import http_status, retry_after_header
from sordino.server.connections import RECEIVED
from sordino.server.disconnect import until_disconnect
from sordino.server.runtime import Runtime
from sordino.server.service import request_tenant

__all__ = ["INFER_PATH", "error_parts", "with_fast_infer"]

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


def with_fast_infer(app: ASGIApp, runtime: Runtime) -> ASGIApp:
    """Wrap ``app`` so inference requests skip its router and middleware."""
    limit = runtime.config.server.max_request_size

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            match = INFER_PATH.fullmatch(scope["path"])
            if match is not None:
                if scope["method"] == "POST":
                    await _infer(runtime, limit, match, scope, receive, send)
                else:
                    message = f"{scope['method']} is not allowed on {scope['path']}; use POST"
                    await _send(send, 405, encode_error(message), {"Allow": "POST"})
                return
        await app(scope, receive, send)

    return asgi


async def _infer(
    runtime: Runtime,
    limit: int,
    match: re.Match[str],
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    declared: bytes | None = None
    header_length: bytes | None = None
    forwarded: dict[str, str] = {}
    for name, value in scope["headers"]:
        if name == b"content-length":
            declared = value
        elif name == b"inference-header-content-length":
            header_length = value
        elif name in _FORWARDED:
            forwarded[_FORWARDED[name]] = value.decode("latin-1")
    headers: dict[str, str]
    model, version = match["model"], match["version"]
    cache_key: tuple[str, str, bytes] | None = None
    try:
        # Whatever ends the request before the service has it is counted there.
        with runtime.service.receiving(model, version, forwarded.get("x-sordino-tenant")):
            arrived = time.perf_counter()
            body = await _read_body(receive, limit, declared)
            read_s = time.perf_counter() - arrived
            tenants = runtime.tenants
            tenant: str | None = None  # authenticated here at most once a request
            if tenants.required:
                # No key, no answer: which models exist is not told to strangers.
                tenant = tenants.authenticate(forwarded.get("authorization"))
            # An unknown model is answered 404 whatever the body holds, as Triton does; the
            # model's shapes then bound what the body may declare, before anything is built.
            # The one lookup of the request: the service takes the route from here.
            route = runtime.registry.route(model, version)
            runtime.timings.body_read(route.key, read_s)
            cache = runtime.result_cache
            if cache.active(model):
                if tenants.enabled and tenant is None:
                    # A cached answer is no way around the key, nor another tenant's result.
                    tenant = tenants.authenticate(forwarded.get("authorization"))
                cache_key = cache.key(
                    model, version, body, header_length, (tenant or "") if tenants.enabled else ""
                )
                cached = cache.get(cache_key)
                if cached is not None:
                    await _send(send, 200, cached.payload, dict(cached.headers))
                    return
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
            client = scope.get("client")
            if client:
                request.client = str(client[0])
            received = scope.get("extensions", {}).get(RECEIVED)
            if received is not None:
                request.received_at = received["at"]
            if tenant is not None and tenants.enabled:
                runtime.service.tenant_of(request, known=tenant)
            shared = runtime.shared_memory.uses(request)
            if shared:
                runtime.shared_memory.attach(request, runtime.service.tenant_of(request))
        response = await until_disconnect(receive, runtime.service.infer(request, route))
        try:
            if shared:
                runtime.shared_memory.write_outputs(request, response, request_tenant(request))
            payload, headers = encode_infer_response(response, request)
        finally:
            response.release()
        status = 200
        if cache_key is not None and not shared:
            cache.put(cache_key, payload, headers)
    except SordinoError as exc:
        status, payload, headers = error_parts(exc)
    except Exception as exc:  # a defect: answered as JSON like any error, and logged
        log.exception("inference request to %s failed", scope["path"])
        status, payload = 500, encode_error(f"internal error: {type(exc).__name__}")
        headers = {"Content-Type": "application/json"}
    if runtime.stopping:
        # Tell keep-alive clients to reconnect elsewhere rather than reuse a connection
        # the server is about to close.
        headers["Connection"] = "close"
    await _send(send, status, payload, headers)


async def _send(send: Send, status: int, payload: bytes, headers: dict[str, str]) -> None:
    raw = [(b"content-length", str(len(payload)).encode())]
    raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
    if "Content-Type" not in headers:
        raw.append((b"content-type", _JSON))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})


def _too_large(limit: int) -> MalformedBody:
    return MalformedBody(
        f"the request body is larger than the limit of {limit} bytes; send less data per "
        "request or raise server.max_request_size",
        too_large=True,
    )


async def _read_body(receive: Receive, limit: int, declared: bytes | None) -> bytes:
    # More digits than any limit has is too large without asking int() (and its digit cap).
    if (
        declared is not None
        and declared.isdigit()
        and (len(declared) > 18 or int(declared) > limit)
    ):
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise Cancelled("the client disconnected while sending the request")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
