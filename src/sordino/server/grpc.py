"""The KServe v2 gRPC endpoint: ``inference.GRPCInferenceService`` on grpc.aio.

The servicer runs in the same event loop as the HTTP server and calls the same
:class:`Runtime`, so a gRPC request and an HTTP request share admission, queues,
batches, metrics and statistics. Every error is a :class:`SordinoError` mapped to a
gRPC status by ``protocol/status.py``, with the same message HTTP would send.

Requests arrive as bytes and are parsed here, so a message that is not valid protobuf
gets INVALID_ARGUMENT naming the message type, and on ``ModelStreamInfer`` it gets an
error response on that stream while the stream stays open. A cancelled call cancels
the task awaiting the runtime, which removes its queued request (counted as cancelled).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc

from sordino import __version__
from sordino.control.admin import AdminAccess
from sordino.errors import ModelResponseError, SordinoError
from sordino.inference import InferRequest, InferResponse
from sordino.protocol.grpc_codec import (
    decode_infer_request,
    encode_infer_response,
    encode_parameters,
    message_from_json,
    parse_message,
)
from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.server.guarding import server_ready, versions_ready
from sordino.server.http import EXTENSIONS
from sordino.server.log_settings import tell_workers
from sordino.server.model_config import model_metadata_json, triton_config_json
from sordino.server.model_control import ModelControl, load_parameters
from sordino.server.runtime import Runtime
from sordino.server.service import request_tenant
from sordino.server.shm import cuda_register, cuda_status
from sordino.server.streams import StreamLimit, peer_address
from sordino.server.tracing import sent
from sordino.telemetry.log_settings import process_log_settings

__all__ = ["SERVICE", "UNSUPPORTED_RPCS", "Caller", "InferenceServicer", "Unary"]

log = logging.getLogger("sordino.grpc")

SERVICE = "inference.GRPCInferenceService"
"""The service's name on the wire (its method paths are ``/SERVICE/Method``)."""

UNSUPPORTED_RPCS: dict[str, str] = {}
"""Triton RPCs sordino answers with UNIMPLEMENTED, and the message it sends (after
``Name: ``): none at present (``TraceSetting`` was, until the trace extension)."""

FINAL_RESPONSE = "triton_final_response"
EMPTY_FINAL_RESPONSE = "triton_enable_empty_final_response"

Unary = Callable[[bytes, Any], Awaitable[Any]]


class InferenceServicer:
    """The RPC implementations; each takes the raw request bytes and the call context."""

    def __init__(self, runtime: Runtime, control: ModelControl) -> None:
        """The inference and shared-memory RPCs use only ``runtime.inference``'s parts;
        readiness, metadata and statistics read the runtime itself."""
        self.runtime = runtime
        self.control = control
        parts = runtime.inference
        self._service, self._registry = parts.service, parts.registry
        self._shared, self._tenants = parts.shared_memory, parts.tenants
        # The Repository* RPCs are protected endpoints, as their HTTP twins.
        self.streams = StreamLimit(runtime.config.server.max_streams_per_client)
        self.access = AdminAccess.from_config(
            runtime.config.server, runtime.config.auth, parts.tenants.is_tenant_key
        )

    def _key(self, context: Any) -> None:
        """With ``auth.required``, the call must bear a tenant's or an admin key (the
        health RPCs ServerLive and ServerReady need none)."""
        tenants = self._tenants
        if not tenants.required:
            return
        given = None
        for key, value in context.invocation_metadata() or ():
            if str(key).lower() == "authorization":
                given = str(value)
        tenants.authenticate(given)

    async def ServerLive(self, raw: bytes, context: Any) -> pb.ServerLiveResponse:
        parse_message(pb.ServerLiveRequest, raw)
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, raw: bytes, context: Any) -> pb.ServerReadyResponse:
        parse_message(pb.ServerReadyRequest, raw)
        # As /v2/health/ready: not ready while a loaded model cannot serve (or is wedged),
        # or says it is not ready (is_ready()).
        return pb.ServerReadyResponse(ready=await server_ready(self.runtime))

    async def ModelReady(self, raw: bytes, context: Any) -> pb.ModelReadyResponse:
        self._key(context)
        request = parse_message(pb.ModelReadyRequest, raw)
        # Like Triton: an unknown model is "not ready", not an error.
        versions = self.runtime.versions(request.name)
        wanted = not request.version or request.version in versions
        ready = self.runtime.ready and bool(versions) and wanted
        if ready:  # every version asked serves and none says it is not ready
            ready = await versions_ready(self.runtime, request.name, request.version)
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, raw: bytes, context: Any) -> pb.ServerMetadataResponse:
        self._key(context)
        parse_message(pb.ServerMetadataRequest, raw)
        return pb.ServerMetadataResponse(name="sordino", version=__version__, extensions=EXTENSIONS)

    async def ModelMetadata(self, raw: bytes, context: Any) -> pb.ModelMetadataResponse:
        self._key(context)
        request = parse_message(pb.ModelMetadataRequest, raw)
        model = self.runtime.get(request.name, request.version or None)
        document = model_metadata_json(model, self.runtime.versions(request.name))
        return message_from_json(document, pb.ModelMetadataResponse)

    async def ModelConfig(self, raw: bytes, context: Any) -> pb.ModelConfigResponse:
        self._key(context)
        request = parse_message(pb.ModelConfigRequest, raw)
        model = self.runtime.get(request.name, request.version or None)
        config = message_from_json(triton_config_json(model), pb.ModelConfig)
        return pb.ModelConfigResponse(config=config)

    async def ModelStatistics(self, raw: bytes, context: Any) -> pb.ModelStatisticsResponse:
        self._key(context)
        request = parse_message(pb.ModelStatisticsRequest, raw)
        document = self.runtime.triton_statistics(request.name or None, request.version or None)
        return message_from_json(document, pb.ModelStatisticsResponse)

    async def ModelInfer(self, raw: bytes, context: Any) -> pb.ModelInferResponse:
        with self._service.receiving() as arrival:
            message = parse_message(pb.ModelInferRequest, raw)
            arrival.model, arrival.version = message.model_name, message.model_version or None
            # An unknown model is answered NOT_FOUND whatever the message holds, as Triton does.
            # The one lookup of the request: the service takes the route from here.
            route = self._registry.route(message.model_name, message.model_version or None)
            request = decode_infer_request(
                message, metadata=route.metadata, max_batch_size=route.max_batch_size
            )
            _Caller.of(context).stamp(request)
            shared = self._shared.uses(request)
            if shared:
                self._shared.attach(request, self._service.tenant_of(request))
        request.trace = "GRPC"  # the answer is encoded here: a trace's sending is stamped here
        response = await self._service.infer(request, route)
        if request.trace == "GRPC":  # not traced
            return self._encoded(request, response, shared)
        return sent(request, functools.partial(self._encoded, request, response, shared))

    def _encoded(
        self, request: InferRequest, response: InferResponse, shared: bool
    ) -> pb.ModelInferResponse:
        """``response`` encoded (its shared-memory outputs written), then released."""
        try:
            if shared:
                self._shared.write_outputs(request, response, request_tenant(request))
            return encode_infer_response(response, request)
        finally:
            response.release()

    async def SystemSharedMemoryStatus(
        self, raw: bytes, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        request = parse_message(pb.SystemSharedMemoryStatusRequest, raw)
        regions = self._shared.status(
            self._service.caller_tenant(_metadata(context)), request.name or None
        )
        response = pb.SystemSharedMemoryStatusResponse()
        for region in regions:
            response.regions[region["name"]].CopyFrom(
                pb.SystemSharedMemoryStatusResponse.RegionStatus(**region)
            )
        return response

    async def SystemSharedMemoryRegister(
        self, raw: bytes, context: Any
    ) -> pb.SystemSharedMemoryRegisterResponse:
        request = parse_message(pb.SystemSharedMemoryRegisterRequest, raw)
        self._shared.register(
            self._service.caller_tenant(_metadata(context)),
            request.name,
            request.key,
            request.offset,
            request.byte_size,
        )
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(
        self, raw: bytes, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        request = parse_message(pb.SystemSharedMemoryUnregisterRequest, raw)
        self._shared.unregister(
            self._service.caller_tenant(_metadata(context)), request.name or None
        )
        return pb.SystemSharedMemoryUnregisterResponse()

    # CUDA shared memory, answered as Triton answers on a server without GPUs. Its
    # messages are not in our proto; their wire form is the system ones' (a name in
    # field 1; status: a map of regions, here always empty; unregister: nothing).

    async def CudaSharedMemoryStatus(
        self, raw: bytes, context: Any
    ) -> pb.SystemSharedMemoryStatusResponse:
        self._service.caller_tenant(_metadata(context))  # the usual credentials
        request = parse_message(pb.SystemSharedMemoryStatusRequest, raw)
        cuda_status(request.name or None)
        return pb.SystemSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, raw: bytes, context: Any) -> NoReturn:
        self._service.caller_tenant(_metadata(context))
        request = parse_message(pb.SystemSharedMemoryUnregisterRequest, raw)  # name: field 1
        cuda_register(request.name)

    async def CudaSharedMemoryUnregister(
        self, raw: bytes, context: Any
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self._service.caller_tenant(_metadata(context))
        parse_message(pb.SystemSharedMemoryUnregisterRequest, raw)
        return pb.SystemSharedMemoryUnregisterResponse()

    async def RepositoryIndex(self, raw: bytes, context: Any) -> pb.RepositoryIndexResponse:
        self.access.check_grpc(context)
        request = parse_message(pb.RepositoryIndexRequest, raw)
        response = pb.RepositoryIndexResponse()
        for entry in self.control.index(ready_only=request.ready):
            response.models.add(
                name=entry.name, version=entry.version, state=entry.state, reason=entry.reason
            )
        return response

    async def RepositoryModelLoad(self, raw: bytes, context: Any) -> pb.RepositoryModelLoadResponse:
        self.access.check_grpc(context)
        request = parse_message(pb.RepositoryModelLoadRequest, raw)
        given = {
            name: getattr(value, value.WhichOneof("parameter_choice") or "string_param")
            for name, value in request.parameters.items()
        }
        await self.control.load(request.model_name, load_parameters(given))
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(
        self, raw: bytes, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        self.access.check_grpc(context)
        request = parse_message(pb.RepositoryModelUnloadRequest, raw)
        dependents = request.parameters.get("unload_dependents")
        await self.control.unload(
            request.model_name, unload_dependents=dependents is not None and dependents.bool_param
        )
        return pb.RepositoryModelUnloadResponse()

    async def LogSettings(self, raw: bytes, context: Any) -> pb.LogSettingsResponse:
        """Triton's logging extension: the settings, after the request's changes."""
        self.access.check_grpc(context)
        request = parse_message(pb.LogSettingsRequest, raw)
        changes: dict[str, Any] = {}
        for name, value in request.settings.items():
            which = value.WhichOneof("parameter_choice")
            changes[name] = None if which is None else getattr(value, which)
        settings = process_log_settings()
        response = pb.LogSettingsResponse()
        current = settings.update(changes) if changes else settings.current()
        if changes:
            await tell_workers(self.runtime.executor, current)
        for name, now in current.items():
            entry = response.settings[name]
            if isinstance(now, bool):
                entry.bool_param = now
            elif isinstance(now, int):
                entry.uint32_param = now
            else:
                entry.string_param = str(now)
        return response

    async def TraceSetting(self, raw: bytes, context: Any) -> pb.TraceSettingResponse:
        """Triton's trace extension: the settings of the server or of ``model_name``,
        after the request's changes (a setting with no value: take the server's)."""
        self.access.check_grpc(context)
        request = parse_message(pb.TraceSettingRequest, raw)
        changes: dict[str, Any] = {}
        for name, given in request.settings.items():
            values = list(given.value)
            changes[name] = (values if name == "trace_level" else values[0]) if values else None
        tracer, model = self._service.tracer, request.model_name or None
        response = pb.TraceSettingResponse()
        settings = tracer.update(changes, model) if changes else tracer.current(model)
        for name, now in settings.items():
            response.settings[name].value.extend(now if isinstance(now, list) else [now])
        return response

    async def ModelStreamInfer(self, context: Any) -> None:
        """Serve one bidirectional stream: each request runs concurrently (at most
        ``server.max_requests_per_stream`` at once); errors stay in it.

        Each request gets its responses (several for a streaming model), the last
        flagged ``triton_final_response``; a request that fails gets one response with
        ``error_message`` and the stream goes on, whatever went wrong with it. When the
        client half-closes, the requests in progress finish; when it cancels, they are
        cancelled.
        """
        lock = asyncio.Lock()

        async def send(message: pb.ModelStreamInferResponse) -> None:
            async with lock:
                try:
                    await context.write(message)
                except Exception as exc:  # gRPC core refused the write: the client left
                    raise _StreamGone from exc

        tasks: set[asyncio.Task[None]] = set()
        caller = _Caller.of(context)  # the call's metadata: the same for every request
        in_flight = self.runtime.config.server.max_requests_per_stream
        try:
            while True:
                while len(tasks) >= in_flight:
                    # Read no further until one is answered: a client that sends faster
                    # than its answers go out (or never reads them) waits in gRPC's flow
                    # control, instead of its requests and answers piling up here.
                    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
                raw = await context.read()
                if raw is grpc.aio.EOF:
                    break
                task = asyncio.get_running_loop().create_task(self._stream_one(raw, send, caller))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                # _stream_one answers its own failures, so one request never ends the others.
                await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _stream_one(
        self,
        raw: bytes,
        send: Callable[[pb.ModelStreamInferResponse], Awaitable[None]],
        caller: _Caller | None = None,
    ) -> None:
        """Answer one stream request: its responses, or one error response; never raise.

        Only cancellation (the stream is going away) and a failure to write to the
        stream itself end it without an answer.
        """
        request_id = model = version = ""
        try:
            with self._service.receiving() as arrival:
                message = parse_message(pb.ModelInferRequest, raw)
                request_id, model, version = message.id, message.model_name, message.model_version
                arrival.model, arrival.version = model, version or None
                # An unknown model wins over a bad message; its shapes bound what it may declare.
                route = self._registry.route(model, version or None)
                request = decode_infer_request(
                    message, metadata=route.metadata, max_batch_size=route.max_batch_size
                )
                if caller is not None:
                    caller.stamp(request)
                shared = self._shared.uses(request)
                if shared:
                    self._shared.attach(request, self._service.tenant_of(request))
            empty_final = bool(request.parameters.pop(EMPTY_FINAL_RESPONSE, False))
            # A step model's last step (Triton's repeat and square backends, in sordino's
            # ONNX form) ends with its outputs, where Triton's backend sends the final
            # flag alone: asked for the empty final response, the client gets it after.
            split = empty_final and route.metadata.stream is not None
            ended = False  # a response flagged final was sent: no empty one after it
            async with aclosing(self._service.responses(request, route)) as responses:
                async for response, final in responses:
                    ended = final and not split
                    if isinstance(response, SordinoError):
                        # The model's error response within its stream, as Triton sends it:
                        # the message, the request's id and model, and the stream goes on.
                        await send(_error_response(str(response), model, request_id, final=final))
                        continue
                    try:
                        if shared:
                            self._shared.write_outputs(request, response, request_tenant(request))
                        encoded = encode_infer_response(response, request)
                    finally:
                        response.release()
                    encode_parameters({FINAL_RESPONSE: ended}, encoded.parameters)
                    model, version = encoded.model_name, encoded.model_version
                    await send(pb.ModelStreamInferResponse(infer_response=encoded))
            if empty_final and not ended:
                # The model's final flag came alone (Triton 2.51 sends an empty response
                # for it when asked: the model's name and the request's id, no version).
                last = pb.ModelInferResponse(model_name=model, id=request_id)
                encode_parameters({FINAL_RESPONSE: True}, last.parameters)
                await send(pb.ModelStreamInferResponse(infer_response=last))
            return
        except _StreamGone:
            # Cancelled or disconnected as its answer went out: nobody is left to answer,
            # and nothing is wrong with the server (it was logged as an error, traceback
            # and all, whenever a client cancelled a stream mid-answer).
            log.debug("stream request %r: the client left before its answer", request_id)
            return
        except ModelResponseError as exc:
            # The model's error response with the final flag: Triton marks it final.
            failed = _error_response(str(exc), model, request_id, final=True)
        except SordinoError as exc:
            log.debug("stream request %r failed: %s", request_id, exc)
            failed = _error_response(str(exc), model, request_id, version=version)
        except Exception as exc:
            log.exception("stream request %r failed", request_id)
            error = f"internal error: {type(exc).__name__}: {exc}"
            failed = _error_response(error, model, request_id, version=version)
        try:
            await send(failed)
        except Exception:
            # The stream itself is broken (the client is gone); nobody is left to answer.
            log.debug("could not send the error of stream request %r", request_id)


class _StreamGone(Exception):
    """A stream's write failed in gRPC core: its client cancelled or disconnected."""


def _error_response(
    message: str, model: str, request_id: str, *, final: bool | None = None, version: str = ""
) -> pb.ModelStreamInferResponse:
    """An error response in a stream: ``message`` for request ``request_id`` of ``model``.

    A model's own error response (``final`` given) is as Triton 2.51 sends it: no
    version, ``triton_final_response`` as the model flagged it. Without ``final``, the
    request's end by sordino's error (``version`` as far as it is known)."""
    answer = pb.ModelInferResponse(model_name=model, model_version=version, id=request_id)
    if final is not None:
        encode_parameters({FINAL_RESPONSE: final}, answer.parameters)
    return pb.ModelStreamInferResponse(error_message=message, infer_response=answer)


def _metadata(context: Any) -> dict[str, str]:
    return {
        key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)
    }


@dataclass(frozen=True, slots=True)
class _Caller:
    """What a call's metadata says about its caller, read once per call (grpc.aio builds
    the metadata pairs afresh at every ``invocation_metadata()``, ~7 µs here)."""

    client: str | None
    """The peer address (``host``), for rules keyed by client."""
    headers: dict[str, str]
    """``authorization`` (the API key: the first one sent) and ``x-sordino-tenant`` (the
    last one sent, when not empty), as HTTP carries them."""

    @classmethod
    def of(cls, context: Any) -> _Caller:
        api_key: str | None = None
        tenant = ""
        for key, value in context.invocation_metadata() or ():
            # Keys arrive lower-case: gRPC metadata keys are HTTP/2 header names.
            if key == "authorization":
                if api_key is None:
                    api_key = str(value)
            elif key == "x-sordino-tenant" and isinstance(value, str):
                tenant = value
        headers = {"x-sordino-tenant": tenant} if tenant else {}
        if api_key is not None:
            headers["authorization"] = api_key
        return cls(peer_address(context.peer() or "") or None, headers)

    def stamp(self, request: InferRequest) -> None:
        """Give ``request`` the caller's address and credentials headers."""
        request.client = self.client
        request.headers.update(self.headers)


Caller = _Caller
"""What a call's metadata says about its caller (the front ends stamp requests with it)."""
