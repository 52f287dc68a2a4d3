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
from sordino.inference import InferRequest, InferResponse, ModelMetadata
from sordino.protocol.codec import decode_infer_request, parse_header_length
from sordino.protocol.encode import encode_error, encode_infer_response
from sordino.protocol.status import http_status, retry_after_header
from sordino.server.connection_guard import RECEIVED
from sordino.server.disconnect import until_disconnect
from sordino.server.http_coding import coded, inflate
from sordino.server.inference_parts import InferenceParts
from sordino.server.route import Route
from sordino.server.runtime import Runtime
from sordino.server.service import request_tenant
from sordino.server.tracing import sent

__all__ = [
    "INFER_PATH",
    "READ_HEADERS",
    "Answer",
    "BodyReader",
    "Opened",
    "Watch",
    "admit",
    "answer_error",
    "answer_infer",
    "check_declared",
    "decode_body",
    "encode_response",
    "error_parts",
    "finish_infer",
    "open_infer",
    "open_request",
    "parse_headers",
    "serve",
    "serve_opened",
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
    # A compressed body, a compressed answer (server/http_coding.py).
    b"content-encoding": "content-encoding",
    b"accept-encoding": "accept-encoding",
}
READ_HEADERS = frozenset({b"content-length", b"inference-header-content-length", *_FORWARDED})
"""Every header :func:`parse_headers` reads (what a front end forwards of a request)."""
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


Answer = tuple[int, bytes, dict[str, str]]
"""An answer as written: status, payload, headers (names as written)."""


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
) -> Answer:
    """Answer one ``POST …/infer``: its status, body and headers (names as written).

    Transport-neutral: ``raw_headers`` are the request's (names in lower case),
    ``read_body`` reads the body, ``watch`` runs the service's work so that a client
    that leaves cancels it. Every outcome is an answer: errors are ``{"error": …}``.
    The steps — :func:`decode_body`, :func:`open_request`, :func:`serve`,
    :func:`encode_response` — are those a front-end process and the engine split
    between them (``server/engine_link.py``); with the body read, :func:`open_infer`
    and :func:`serve_opened` are this function's two halves. ``parts`` are the
    runtime's parts a request uses (``Runtime.inference``; a :class:`Runtime` is taken
    for its ``inference``).
    """
    if not isinstance(parts, InferenceParts):
        parts = parts.inference
    parsed = parse_headers(raw_headers)
    try:
        # Whatever ends the request before the service has it is counted there.
        with parts.service.receiving(model, version, parsed[2].get("x-sordino-tenant")):
            check_declared(parts.max_request_size, parsed[0])
            arrived = time.perf_counter()
            body = await read_body()
    except Exception as exc:
        return _told(parts, answer_error(exc, path))
    opened = open_infer(
        parts,
        model,
        version,
        parsed,
        body,
        time.perf_counter() - arrived,
        client=client,
        received_at=received_at,
        path=path,
    )
    if not isinstance(opened, Opened):
        return opened
    return await serve_opened(parts, opened, watch, path)


class Opened:
    """A request decoded and past the engine's checks (:func:`open_infer`), for the
    service: its route, whether it uses system shared memory, and its result-cache key
    (None when its model caches no results)."""

    __slots__ = ("cache_key", "request", "route", "shared")

    def __init__(
        self,
        request: InferRequest,
        route: Route,
        shared: bool,
        cache_key: tuple[str, str, bytes] | None,
    ) -> None:
        self.request, self.route, self.shared, self.cache_key = request, route, shared, cache_key


def open_infer(
    parts: InferenceParts,
    model: str,
    version: str | None,
    parsed: tuple[bytes | None, bytes | None, dict[str, str]],
    body: bytes,
    read_s: float,
    *,
    client: str | None,
    received_at: float | None,
    path: str,
) -> Opened | Answer:
    """The request whose whole ``body`` was read, up to the service: authenticated, its
    model looked up once, answered from the result cache, or decoded with its tenant and
    shared-memory inputs attached. Never waits. Returns the :class:`Opened` request, or
    the answer that ends it (an error, counted; a cached result). ``parsed`` is
    :func:`parse_headers`' reading of the request's headers."""
    _, header_length, forwarded = parsed
    cache_key: tuple[str, str, bytes] | None = None
    try:
        with parts.service.receiving(model, version, forwarded.get("x-sordino-tenant")):
            limit = parts.max_request_size
            # The whole body: its length says what a Content-Length past the limit would.
            if len(body) > limit:
                raise too_large(limit)
            coding = forwarded.get("content-encoding")
            if coding is not None:
                body = inflate(body, coding, limit)
            tenant, route = open_request(parts, model, version, forwarded, read_s)
            cache = parts.result_cache
            if cache.active(model):
                tenants = parts.tenants
                if tenants.enabled and tenant is None:
                    # A cached answer is no way around the key, nor another tenant's result.
                    tenant = tenants.authenticate(forwarded.get("authorization"))
                cache_key = cache.key(
                    model, version, body, header_length, (tenant or "") if tenants.enabled else ""
                )
                cached = cache.get(cache_key)
                if cached is not None:
                    answer = coded(forwarded, cached.payload, dict(cached.headers))
                    return _told(parts, (200, *answer))
            request = decode_body(
                body,
                model,
                version,
                header_length,
                forwarded,
                client=client,
                received_at=received_at,
                metadata=route.metadata,
                max_batch_size=route.max_batch_size,
            )
            shared = admit(parts, request, tenant)
    except Exception as exc:
        return _told(parts, answer_error(exc, path))
    return Opened(request, route, shared, cache_key)


async def serve_opened(parts: InferenceParts, opened: Opened, watch: Watch, path: str) -> Answer:
    """The service's part of an :class:`Opened` request, in a task: its answer."""
    request = opened.request
    request.trace = "HTTP"  # the answer is encoded here: a trace's sending is stamped here
    try:
        response = await serve(parts, request, opened.route, opened.shared, watch)
    except Exception as exc:
        return _told(parts, answer_error(exc, path))
    if request.trace == "HTTP":  # not traced
        return finish_infer(parts, opened, response, path)
    return sent(request, lambda: finish_infer(parts, opened, response, path))


def finish_infer(
    parts: InferenceParts, opened: Opened, outcome: InferResponse | Exception, path: str
) -> Answer:
    """The answer of an :class:`Opened` request from the service's ``outcome``: the
    response encoded (and released; kept in the result cache when its model keeps
    results), or the error's answer."""
    if isinstance(outcome, Exception):
        return _told(parts, answer_error(outcome, path))
    try:
        payload, headers = encode_response(outcome, opened.request)
        if opened.cache_key is not None and not opened.shared:
            parts.result_cache.put(opened.cache_key, payload, headers)
        if opened.request.headers is not None:
            payload, headers = coded(opened.request.headers, payload, headers)
    except Exception as exc:
        return _told(parts, answer_error(exc, path))
    return _told(parts, (200, payload, headers))


def _told(parts: InferenceParts, answer: Answer) -> Answer:
    """``answer``, telling a kept-alive client to go elsewhere once the server stops."""
    if parts.registry.stopping:
        # Tell keep-alive clients to reconnect elsewhere rather than reuse a connection
        # the server is about to close.
        answer[2]["Connection"] = "close"
    return answer


def parse_headers(
    raw_headers: Iterable[tuple[bytes, bytes]],
) -> tuple[bytes | None, bytes | None, dict[str, str]]:
    """The ``Content-Length``, the ``Inference-Header-Content-Length`` and the headers
    the service reads (``x-sordino-*``, ``authorization``) and the transport's codings
    (``content-encoding``, ``accept-encoding``) of a request's headers."""
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
    return declared, header_length, forwarded


def decode_body(
    body: bytes,
    model: str,
    version: str | None,
    header_length: bytes | None,
    forwarded: dict[str, str],
    *,
    client: str | None,
    received_at: float | None,
    metadata: ModelMetadata | None = None,
    max_batch_size: int = 0,
    json_values: int | None = None,
) -> InferRequest:
    """Decode step: ``body`` as an :class:`InferRequest` with the transport's facts.

    Without the model's ``metadata`` (a front-end process has none) the declared shapes
    are bounded by the body's size only; :func:`check_model_shapes` then does the rest
    where the model is known. ``json_values`` (a front end's, from the engine's load
    board) bounds the JSON part as the metadata would. Raises SordinoError for a
    malformed body.
    """
    request = decode_infer_request(
        body,
        model=model,
        version=version,
        header_length=parse_header_length(
            header_length.decode("latin-1") if header_length is not None else None
        ),
        headers=forwarded or None,
        metadata=metadata,
        max_batch_size=max_batch_size,
        json_values=json_values,
    )
    if client:
        request.client = client
    if received_at is not None:
        request.received_at = received_at
    return request


def open_request(
    parts: InferenceParts,
    model: str,
    version: str | None,
    forwarded: dict[str, str],
    read_s: float,
) -> tuple[str | None, Route]:
    """Authentication (when keys are required) and the request's one model lookup.

    Returns the tenant authenticated (None when not yet) and the route. An unknown
    model is answered 404 whatever the body holds, as Triton does. Runs inside
    ``service.receiving``.
    """
    tenants = parts.tenants
    tenant: str | None = None  # authenticated here at most once a request
    if tenants.required:
        # No key, no answer: which models exist is not told to strangers.
        tenant = tenants.authenticate(forwarded.get("authorization"))
    # The one lookup of the request: the service takes the route from here.
    route = parts.registry.route(model, version)
    parts.timings.body_read(route.key, read_s)
    return tenant, route


def admit(parts: InferenceParts, request: InferRequest, tenant: str | None) -> bool:
    """The request's tenant and its system shared-memory inputs; whether it uses any."""
    if tenant is not None and parts.tenants.enabled:
        parts.service.tenant_of(request, known=tenant)
    shared = parts.shared_memory.uses(request)
    if shared:
        parts.shared_memory.attach(request, parts.service.tenant_of(request))
    return shared


async def serve(
    parts: InferenceParts, request: InferRequest, route: Route, shared: bool, watch: Watch
) -> InferResponse:
    """Service step: the scheduler's answer, its shared-memory outputs written.

    The caller releases the response once it is encoded (or sent on).
    """
    response = await watch(parts.service.infer(request, route))
    if shared:
        try:
            parts.shared_memory.write_outputs(request, response, request_tenant(request))
        except BaseException:
            response.release()
            raise
    return response


def encode_response(response: InferResponse, request: InferRequest) -> tuple[bytes, dict[str, str]]:
    """Encode step: the body and headers of ``response``; the response is released."""
    try:
        return encode_infer_response(response, request)
    finally:
        response.release()


def answer_error(exc: Exception, path: str) -> tuple[int, bytes, dict[str, str]]:
    """The answer of an error: :func:`error_parts` for a SordinoError, else a logged 500."""
    if isinstance(exc, SordinoError):
        return error_parts(exc)
    # A defect: answered as JSON like any error, and logged.
    log.error("inference request to %s failed", path, exc_info=exc)
    return (
        500,
        encode_error(f"internal error: {type(exc).__name__}"),
        {"Content-Type": "application/json"},
    )


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
