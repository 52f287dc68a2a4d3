"""Answering a model's calls to other models of this server (Triton's BLS).

A Python model's ``pb_utils.InferenceRequest(...).exec()`` reaches here as a
:class:`~sordino.backends.calls.ModelCall` (over its worker's pipe, or from a thread
instance; ``execution/model_calls.py``). :class:`ModelCalls` turns it into an
:class:`~sordino.inference.InferRequest` and runs it through
:class:`~sordino.server.service.InferenceService`, the path every client request
takes: validation, admission (priority, deadline, tenant limits and breakers),
quotas, the scheduler's batching and the executor's breakers all apply, and the call
is counted in the metrics as any request.

The call carries its caller's facts:

- priority: the calling request's level, brought into the callee's levels
  (``parameters.priority``; a priority the model sets in the call's parameters wins,
  within what the tenant may claim);
- deadline: the calling request's, as ``parameters.timeout`` (the callee's queue
  policy decides whether a request may shorten its timeout) and as a bound on the
  wait here — past it the call answers an error;
- tenant: the calling request's (``InferRequest.internal_tenant``: no key needed),
  else ``default``.

Dead ends answer an error, never wedge: an unknown or unloaded model (404), a model
calling itself from its only instance (a cycle that would wait forever — Triton
deadlocks there), a decoupled model called without ``decoupled=True``, a deadline
passed, the server stopping (the scheduler ends the request).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

import numpy as np

from sordino.backends.calls import CallAnswer, ModelCall, failed_answer
from sordino.errors import NotFound, SordinoError
from sordino.inference import InferRequest, InferResponse, RequestedOutput
from sordino.protocol.status import grpc_code_name
from sordino.server.registry import LoadedModel, ModelRegistry
from sordino.server.service import InferenceService

__all__ = ["ModelCalls"]

_TRITON_CODES = {
    "NOT_FOUND": "NOT_FOUND",
    "INVALID_ARGUMENT": "INVALID_ARG",
    "UNIMPLEMENTED": "UNSUPPORTED",
    "UNAVAILABLE": "UNAVAILABLE",
    "RESOURCE_EXHAUSTED": "UNAVAILABLE",
    "CANCELLED": "CANCELLED",
    "ALREADY_EXISTS": "ALREADY_EXISTS",
    "UNKNOWN": "UNKNOWN",  # a callee's own error response with that code
}


def _code(error: SordinoError) -> str:
    """The ``TritonError`` code name of ``error`` (via its gRPC code: one mapping)."""
    return _TRITON_CODES.get(grpc_code_name(error), "INTERNAL")


def _streams(model: LoadedModel) -> bool:
    """Whether ``model`` answers a request with several responses (decoupled / streaming)."""
    metadata = model.metadata
    # ``decoupled``: the field decoupled Python models bring (read so while it may be absent).
    return metadata.stream is not None or bool(getattr(metadata, "decoupled", False))


def _bytes_elements(array: Any) -> Any:
    """A BYTES tensor's elements as ``bytes`` (a model may build it from ``str``)."""
    if isinstance(array, np.ndarray) and array.dtype == np.object_:
        flat = [x.encode() if isinstance(x, str) else x for x in array.reshape(-1)]
        out = np.empty(len(flat), dtype=np.object_)
        out[:] = flat
        return out.reshape(array.shape)
    return array


def _answer(response: InferResponse, final: bool) -> CallAnswer:
    """The answer carrying ``response``'s outputs (copied: the response is released)."""
    try:
        outputs = {name: np.array(array, copy=True) for name, array in response.outputs.items()}
    finally:
        response.release()
    return CallAnswer(outputs=outputs, final=final)


class ModelCalls:
    """Answers models' calls to other models through the inference service."""

    def __init__(self, service: InferenceService, registry: ModelRegistry) -> None:
        self._service = service
        self._registry = registry

    async def __call__(self, call: ModelCall) -> AsyncIterator[CallAnswer]:
        """Each response to ``call`` as it comes, the last one ``final``."""
        where = f"BLS call to model {call.model!r}"
        try:
            model = self._registry.get(call.model, call.version or None)
        except SordinoError as exc:
            missing = isinstance(exc, NotFound)
            said = f"it is not loaded ({exc})" if missing else str(exc)
            yield failed_answer(f"{where}: {said}", _code(exc))
            return
        refused = self._refusal(call, model)
        if refused is not None:
            yield failed_answer(f"{where}: {refused[0]}", refused[1])
            return
        request, wait_s = self._request(call, model)
        if wait_s is not None and wait_s <= 0:
            request.release()
            yield failed_answer(
                f"{where}: the calling request's deadline has passed", "UNAVAILABLE"
            )
            return
        try:
            async with asyncio.timeout(wait_s):
                if call.decoupled:
                    async with aclosing(self._service.responses(request)) as responses:
                        async for response, final in responses:
                            if isinstance(response, SordinoError):  # the callee's, mid-stream
                                yield CallAnswer(
                                    error=f"{where}: {response}", code=_code(response), final=final
                                )
                                continue
                            yield _answer(response, final)
                            if final:
                                return
                    yield CallAnswer(final=True)
                    return
                response = await self._service.infer(request)
        except SordinoError as exc:
            yield failed_answer(f"{where}: {exc}", _code(exc))
            return
        except TimeoutError:
            yield failed_answer(
                f"{where}: no answer before the calling request's deadline "
                f"({wait_s:.3g} s were left)",
                "UNAVAILABLE",
            )
            return
        yield _answer(response, True)

    def _refusal(self, call: ModelCall, model: LoadedModel) -> tuple[str, str] | None:
        """Why ``call`` cannot be served at all (message, code), or None."""
        if call.caller and call.caller == model.key.name and model.instances <= 1:
            return (
                f"model {call.caller!r} calls itself, and its only instance is the one "
                "calling: the call would wait for that instance forever (a BLS cycle). "
                "Give the model more instances or call another model",
                "UNAVAILABLE",
            )
        if _streams(model) and not call.decoupled:
            return (
                "the model is decoupled (it may send several responses): call it with "
                "exec(decoupled=True) or async_exec(decoupled=True)",
                "INVALID_ARG",
            )
        return None

    def _request(self, call: ModelCall, model: LoadedModel) -> tuple[InferRequest, float | None]:
        """The request for ``call``, and how long to wait for it (None: no bound)."""
        parameters: dict[str, Any] = dict(call.parameters)
        if call.priority is not None:
            levels = model.scheduling.queue.priority_levels
            parameters.setdefault("priority", min(max(int(call.priority), 1), levels))
        wait_s = None if call.deadline is None else call.deadline - time.time()
        timeouts = [t for t in (call.timeout_us, wait_s and int(wait_s * 1e6)) if t and t > 0]
        if timeouts and "timeout" not in parameters:
            parameters["timeout"] = max(1, min(timeouts))
        request = InferRequest(
            model=call.model,
            version=call.version or None,
            inputs={name: _bytes_elements(array) for name, array in call.inputs.items()},
            id=call.request_id or None,
            outputs=[RequestedOutput(name) for name in call.outputs] or None,
            parameters=parameters,
            internal_tenant=call.tenant or "default",
        )
        return request, wait_s
