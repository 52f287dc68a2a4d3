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
- deadline: the calling request's, as the ``X-Sordino-Timeout`` a client may send
  (the callee's queue policy decides whether a request may shorten its timeout; a
  call's own ``timeout`` comes first, as ``parameters.timeout``, which is what the
  callee's ``timeout()`` shows, as on Triton) and as a bound on the wait here — past it
  the call answers an error;
- tenant: the calling request's (``InferRequest.internal_tenant``: no key needed),
  else ``default``.

A call of the model loading API (``ModelCall.control``: ``pb_utils.load_model``,
``unload_model``, ``is_model_ready``) goes to model control instead
(:class:`ModelLoading`, the server's ``ModelControl`` once it has started): a load runs
to its end even if the call is given up, and an unload is answered once the model no
longer serves, while its drain goes on (a model may unload the model whose request it
is executing, itself included).

Dead ends answer an error, never wedge: an unknown or unloaded model (404), a model
calling itself from its only instance (a cycle that would wait forever — Triton
deadlocks there), a decoupled model called without ``decoupled=True``, a deadline
passed, the server stopping (the scheduler ends the request).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing
from typing import Any, Protocol

import numpy as np

from sordino.admission.chain import TIMEOUT_HEADER
from sordino.backends.calls import CallAnswer, ModelCall, failed_answer
from sordino.errors import NotFound, SordinoError
from sordino.inference import InferRequest, InferResponse, RequestedOutput
from sordino.protocol.status import grpc_code_name
from sordino.server.model_uploads import LoadRequest, load_parameters
from sordino.server.registry import LoadedModel, ModelRegistry
from sordino.server.service import InferenceService

__all__ = ["ModelCalls", "ModelLoading"]

log = logging.getLogger("sordino.control")


class ModelLoading(Protocol):
    """What answers the model loading API (the server's ``ModelControl``)."""

    async def load(
        self, name: str, request: LoadRequest | None = None, *, within: str = ""
    ) -> None: ...

    async def unload(
        self, name: str, *, unload_dependents: bool = False, within: str = ""
    ) -> None: ...


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
    """The answer carrying ``response``'s outputs (copied: the response is released) and
    parameters."""
    try:
        outputs = {name: np.array(array, copy=True) for name, array in response.outputs.items()}
    finally:
        response.release()
    return CallAnswer(outputs=outputs, final=final, parameters=dict(response.parameters))


class ModelCalls:
    """Answers models' calls to other models through the inference service."""

    def __init__(
        self,
        service: InferenceService,
        registry: ModelRegistry,
        readiness: Callable[[str, str], Awaitable[bool]] | None = None,
    ) -> None:
        self._service = service
        self._registry = registry
        self.control: ModelLoading | None = None
        """Model control, once the server has started (the model loading API)."""
        self.readiness = readiness
        """Whether a loaded model (any version when "") is ready: serving, and its own
        ``is_ready()`` says so (``guarding.versions_ready``); None: loaded is ready."""
        self._controls: set[asyncio.Task[None]] = set()
        self._waiting: Counter[tuple[str, str]] = Counter()
        """The calls models' ``execute`` waits on now, (caller, callee) by model name."""

    async def __call__(self, call: ModelCall) -> AsyncIterator[CallAnswer]:
        """Each response to ``call`` as it comes, the last one ``final``."""
        if call.control:
            yield await self._control(call)
            return
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
        edge = (call.caller, model.key.name)
        if call.caller:
            self._waiting[edge] += 1  # (its execute waits on it: a cycle back is seen)
        try:
            async for answer in self._answers(call, model, where):
                yield answer
        finally:
            if call.caller:
                self._waiting[edge] -= 1
                if not self._waiting[edge]:
                    del self._waiting[edge]

    async def _answers(
        self, call: ModelCall, model: LoadedModel, where: str
    ) -> AsyncIterator[CallAnswer]:
        """The answers to ``call`` of ``model`` (its refusals checked)."""
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
        cycle = self._cycle(call.caller, model)
        if cycle is not None:
            return (
                f"model {call.caller!r} calls {model.key.name!r}, whose only instance waits "
                f"on a call that leads back to {call.caller!r} ({' -> '.join(cycle)}): each "
                "would wait for the next forever (a BLS cycle). Give one of them more "
                "instances or break the cycle",
                "UNAVAILABLE",
            )
        if _streams(model) and not call.decoupled:
            return (
                "the model is decoupled (it may send several responses): call it with "
                "exec(decoupled=True) or async_exec(decoupled=True)",
                "INVALID_ARG",
            )
        return None

    def _cycle(self, caller: str, model: LoadedModel) -> list[str] | None:
        """The models of a wait that would never end if ``caller`` (one instance, in its
        ``execute``) waited on ``model``: a path of calls that single-instance models'
        ``execute`` waits on now, from ``model`` back to ``caller``; None if there is none.
        """
        if not caller or model.instances > 1 or not self._single(caller):
            return None
        paths = [[caller, model.key.name]]
        seen = {model.key.name}
        while paths:
            path = paths.pop()
            for waiter, callee in self._waiting:
                if waiter != path[-1]:
                    continue
                if callee == caller:
                    return [*path, callee]
                if callee not in seen and self._single(callee):
                    seen.add(callee)
                    paths.append([*path, callee])
        return None

    def _single(self, name: str) -> bool:
        """Whether one instance serves ``name`` (a model that is gone waits on nothing)."""
        try:
            return self._registry.get(name, None).instances <= 1
        except SordinoError:
            return False

    def _request(self, call: ModelCall, model: LoadedModel) -> tuple[InferRequest, float | None]:
        """The request for ``call``, and how long to wait for it (None: no bound)."""
        parameters: dict[str, Any] = dict(call.parameters)
        if call.priority is not None:
            levels = model.scheduling.queue.priority_levels
            parameters.setdefault("priority", min(max(int(call.priority), 1), levels))
        wait_s = None if call.deadline is None else call.deadline - time.time()
        headers: dict[str, str] = {}
        if call.timeout_us > 0 and "timeout" not in parameters:
            parameters["timeout"] = call.timeout_us  # the callee's timeout(), as on Triton
        elif wait_s is not None and wait_s > 0 and "timeout" not in parameters:
            # The caller's deadline bounds the callee's queue, not shown as its timeout().
            headers[TIMEOUT_HEADER] = str(max(1, int(wait_s * 1e6)))
        request = InferRequest(
            model=call.model,
            version=call.version or None,
            inputs={name: _bytes_elements(array) for name, array in call.inputs.items()},
            id=call.request_id or None,
            outputs=[RequestedOutput(name) for name in call.outputs] or None,
            parameters=parameters,
            headers=headers,
            internal_tenant=call.tenant or "default",
        )
        return request, wait_s

    async def _control(self, call: ModelCall) -> CallAnswer:
        """Answer a call of the model loading API."""
        where = f"{_API_NAMES.get(call.control, call.control)}({call.model!r})"
        if call.control == "ready":
            registry = self._registry
            found = registry.contains if call.version else lambda name, _: registry.has(name)
            ready = found(call.model, call.version)
            if ready and self.readiness is not None:  # as the readiness endpoints say
                ready = await self.readiness(call.model, call.version)
            return CallAnswer(parameters={"ready": ready})
        control = self.control
        if control is None:
            return failed_answer(
                f"{where}: the model loading API is available once the server has started "
                "(as on Triton, load the model that uses it after start-up, not with "
                "--load-model)",
                "UNAVAILABLE",
            )
        # The calling batch's deadline (before its execution timeout): past it the call
        # answers, and the operation goes on.
        wait_s = None if call.deadline is None else max(0.0, call.deadline - time.time())
        try:
            async with asyncio.timeout(wait_s):
                if call.control == "load":
                    config = call.parameters.get("config")
                    files = call.parameters.get("files") or {}
                    request = load_parameters({**({"config": config} if config else {}), **files})
                    task = self._keep(control.load(call.model, request, within=call.caller))
                    await asyncio.shield(task)  # given up, it still runs to its end
                elif call.control == "unload":
                    dependents = bool(call.parameters.get("unload_dependents", False))
                    task = self._keep(
                        control.unload(call.model, unload_dependents=dependents, within=call.caller)
                    )
                    served = self._registry.has(call.model)  # else: no drain, wait for the end
                    while not task.done() and (not served or self._registry.has(call.model)):
                        await asyncio.wait({task}, timeout=0.005)
                    if task.done():
                        task.result()
                else:
                    return failed_answer(f"{where}: unknown model control call", "INVALID_ARG")
        except SordinoError as exc:
            return failed_answer(f"{where}: {exc}", _code(exc))
        except TimeoutError:
            return failed_answer(
                f"{where}: not done before the calling request's deadline ({wait_s:.3g} s were "
                "left); it goes on, and is_model_ready says when the model serves",
                "UNAVAILABLE",
            )
        return CallAnswer()

    def _keep(self, operation: Any) -> asyncio.Task[None]:
        """Run a control operation to its end, whoever still waits for it."""
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(operation)
        self._controls.add(task)
        task.add_done_callback(self._controls.discard)
        task.add_done_callback(_unheard)
        return task


_API_NAMES = {"load": "load_model", "unload": "unload_model", "ready": "is_model_ready"}
"""The ``pb_utils`` function each control call comes from (for its errors)."""


def _unheard(task: asyncio.Task[None]) -> None:
    """Log how a control operation failed (its caller may no longer wait for it: an
    unload answered once the model stopped serving, a call given up)."""
    if not task.cancelled() and task.exception() is not None:
        log.warning("model loading API: %s", task.exception())
