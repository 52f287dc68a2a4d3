"""BLS in a Triton Python model: ``InferenceRequest.exec()`` and ``async_exec()``.

Triton's Business Logic Scripting lets a model's ``execute`` ask the server for an
inference on another model. Here the request becomes a
:class:`~sordino.backends.calls.ModelCall` handed to the process's
:class:`~sordino.backends.calls.ModelCaller` (installed by the runtime through
:meth:`PythonBackend.set_caller`), which carries it to the server's request path;
the answers come back as :class:`~sordino.backends.calls.CallAnswer` records and are
turned into ``InferenceResponse`` objects.

As in Triton:

- ``exec()`` blocks and returns one ``InferenceResponse``; a failure of the call (an
  unknown model, a refusal, the callee's error) is a response with ``has_error()``,
  never an exception. Only calling BLS from ``initialize`` or ``finalize`` raises.
- ``async_exec()`` returns an awaitable (an ``asyncio`` future of the running loop).
- ``exec(decoupled=True)`` returns an iterator of the responses; for a model that is
  not decoupled it yields its one response and ends.

What Triton does not do and sordino does: the call carries the priority, deadline and
tenant of the request being executed (:func:`caller_facts`). Which request that is:
the batch whose ``execute`` runs in this thread or coroutine (a context variable the
backend sets), else, for a thread the model started itself, the batch that started
last in this process. When ``execute`` got several requests, the call takes the
strictest of them: the highest priority, the earliest deadline, and the tenant of the
request with the highest priority (Triton carries nothing per request here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from sordino.backends.calls import CallAnswer, ModelCall, ModelCaller

__all__ = [
    "Executing",
    "ResponseIterator",
    "async_exec",
    "caller_facts",
    "executing",
    "install",
    "parameters_text",
    "run_exec",
    "start_call",
]


@dataclass(frozen=True, slots=True)
class Executing:
    """What a model is doing in this context: its name, and ``execute``'s requests
    (empty in ``initialize`` / ``finalize``, where ``phase`` says which)."""

    model: str
    requests: Sequence[Any] = ()
    phase: str = "execute"
    caller: ModelCaller | None = None
    """The model's own caller (several models share a process in thread instances)."""


_CURRENT: ContextVar[Executing | None] = ContextVar("sordino_bls_executing", default=None)
_LATEST: Executing | None = None
"""The batch that started last in this process (for threads a model starts itself)."""
_CALLER: ModelCaller | None = None
_LOCK = threading.Lock()


def install(caller: ModelCaller | None) -> None:
    """Use ``caller`` for this process's BLS calls made outside a model's own context
    (:attr:`Executing.caller` comes first; None: calls answer an error)."""
    global _CALLER
    _CALLER = caller


@contextlib.contextmanager
def executing(state: Executing) -> Iterator[None]:
    """Mark ``state`` as what this thread or coroutine runs, for the calls made meanwhile."""
    global _LATEST
    token = _CURRENT.set(state)
    if state.phase == "execute":
        _LATEST = state
    try:
        yield
    finally:
        _CURRENT.reset(token)
        if _LATEST is state and state.requests:
            # Keep the batch's facts, not its requests (their tensors are arena views).
            facts = _Facts(*caller_facts(state.requests))
            _LATEST = Executing(state.model, (facts,), state.phase, state.caller)


@dataclass(frozen=True, slots=True)
class _Facts:
    """A finished batch's facts, read as a request's (for calls made after it)."""

    _sordino_priority: int | None
    _sordino_deadline: float | None
    _sordino_tenant: str | None


def current() -> Executing | None:
    """What runs in this context, else the batch that started last in this process."""
    return _CURRENT.get() or _LATEST


def caller_facts(requests: Sequence[Any]) -> tuple[int | None, float | None, str | None]:
    """The priority, deadline and tenant a call made while executing ``requests`` carries.

    Read from each request's ``_sordino_priority`` (a level, 1 highest),
    ``_sordino_deadline`` (absolute ``time.time()``) and ``_sordino_tenant``; None
    where no request has one. Several requests: the highest priority, the earliest
    deadline, the tenant of the request with the highest priority (the first such).
    """
    # One pass (it runs once a batch): the tenant of the first request at the best
    # priority so far, and the first tenant of all.
    priority: int | None = None
    deadline: float | None = None
    best_tenant: str | None = None
    first_tenant: str | None = None
    for request in requests:
        level = getattr(request, "_sordino_priority", None)
        end = getattr(request, "_sordino_deadline", None)
        tenant = getattr(request, "_sordino_tenant", None)
        if end is not None and (deadline is None or end < deadline):
            deadline = end
        if tenant and first_tenant is None:
            first_tenant = tenant
        if level is not None and (priority is None or level < priority):
            priority, best_tenant = level, tenant or None
        elif level == priority and tenant and best_tenant is None:
            best_tenant = tenant
    if priority is None:
        return None, deadline, first_tenant
    return priority, deadline, best_tenant or first_tenant


def _text(value: Any, what: str) -> str:
    if isinstance(value, bytes):
        return value.decode()
    if isinstance(value, str):
        return value
    raise _utils().TritonModelException(f"InferenceRequest {what} must be a string, not {value!r}")


def parameters_text(parameters: Any) -> str:
    """A BLS request's ``parameters`` as the JSON text ``parameters()`` answers, taken as
    Triton takes them: a dict of str to bool, int or str (``TritonModelException``
    otherwise, in Triton's words)."""
    if parameters is None or (not parameters and isinstance(parameters, Mapping)):
        return "{}"  # most requests carry none: no encoder (it showed in profiles)
    if not isinstance(parameters, Mapping):
        raise _utils().TritonModelException(
            f"Expect parameters to be a dict, found type {type(parameters)}"
        )
    for key, value in parameters.items():
        if not isinstance(key, str):
            raise _utils().TritonModelException(
                f"Expect parameters keys to have type str, found type {type(key)}"
            )
        if not isinstance(value, bool | int | str):
            raise _utils().TritonModelException(
                f"Expect parameters values to have type bool/int/str, found type {type(value)}"
            )
    return json.dumps(dict(parameters))


def _utils() -> Any:
    from sordino.backends.python import triton_python_backend_utils as utils

    return utils


def build_call(request: Any, decoupled: bool) -> ModelCall:
    """The :class:`ModelCall` of a ``pb_utils.InferenceRequest`` made by model code.

    Raises ``TritonModelException`` for what sordino cannot honour (GPU memory, a
    non-CPU tensor) and, as Triton, for BLS in ``initialize`` / ``finalize``.
    """
    utils = _utils()
    state = current()
    if state is not None and state.phase != "execute":
        raise utils.TritonModelException(
            f"BLS is only supported during the 'execute' function (not in {state.phase})"
        )
    memory = request.preferred_memory()
    if memory.preferred_memory_type == utils.TRITONSERVER_MEMORY_GPU:
        raise utils.TritonModelException(
            "BLS preferred_memory TRITONSERVER_MEMORY_GPU is not supported by sordino: "
            "every tensor is in CPU memory (leave preferred_memory out)"
        )
    inputs = {}
    for tensor in request.inputs():
        if not tensor.is_cpu():
            raise utils.TritonModelException(
                f"BLS input {tensor.name()}: GPU tensors are not supported"
            )
        inputs[tensor.name()] = tensor.as_numpy()
    version = request.model_version()
    version_text = "" if version in (-1, "", None) else str(version)
    parameters = request.parameters()
    params: dict[str, Any] = json.loads(parameters) if isinstance(parameters, str) else {}
    correlation = request.correlation_id()
    if correlation not in (0, ""):
        params["sequence_id"] = correlation
    flags = request.flags()
    if flags & utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
        params["sequence_start"] = True
    if flags & utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
        params["sequence_end"] = True
    priority, deadline, tenant = caller_facts(state.requests if state is not None else ())
    return ModelCall(
        model=_text(request.model_name, "model_name"),
        inputs=inputs,
        version=version_text,
        outputs=tuple(_text(n, "requested output name") for n in request.requested_output_names()),
        request_id=_text(request.request_id(), "request_id"),
        parameters=params,
        priority=priority,
        deadline=deadline,
        tenant=tenant,
        timeout_us=int(request.timeout()),
        decoupled=decoupled,
        # Only a call from execute itself can wait on its own instance (a cycle).
        caller=own.model if (own := _CURRENT.get()) is not None else "",
    )


def _response(answer: CallAnswer) -> Any:
    utils = _utils()
    error = None
    if answer.error:
        code = getattr(utils.TritonError, answer.code or "INTERNAL", utils.TritonError.INTERNAL)
        error = utils.TritonError(answer.error, code)
    tensors = [utils.Tensor(name, array) for name, array in answer.outputs.items()]
    parameters = answer.parameters
    return utils.InferenceResponse(output_tensors=tensors, error=error, parameters=parameters)


def start_call(call: ModelCall, on_answer: Callable[[CallAnswer], None]) -> Callable[[], None]:
    """Send ``call`` with the caller of what runs here (else the process's); ``on_answer``
    gets its answers. Returns the function that gives the call up."""
    state = current()
    caller = state.caller if state is not None and state.caller is not None else _CALLER
    if caller is None:
        on_answer(
            CallAnswer(
                error="BLS is not available here: this model runs where no sordino server "
                "answers its calls (a worker of the Ray executor, or a backend outside a server)",
                code="UNSUPPORTED",
            )
        )
        return lambda: None
    return caller.start(call, on_answer)


class ResponseIterator:
    """The responses of a decoupled BLS call, as they come (Triton's iterator).

    Every answer is yielded, the final one included (it may have no outputs: check
    ``output_tensors()``, as Triton's examples do). ``cancel()`` gives the call up.
    """

    def __init__(self, call: ModelCall) -> None:
        self._answers: queue.SimpleQueue[CallAnswer] = queue.SimpleQueue()
        self._done = False
        self._cancel = start_call(call, self._answers.put)

    def __iter__(self) -> ResponseIterator:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        answer = self._answers.get()
        if answer.final:
            self._done = True
        return _response(answer)

    def cancel(self) -> None:
        """Give the call up; the server cancels it (a final response still comes)."""
        self._cancel()


def run_exec(request: Any, decoupled: bool) -> Any:
    """``InferenceRequest.exec``: the response (or, decoupled, an iterator of them)."""
    call = build_call(request, decoupled)
    if decoupled:
        return ResponseIterator(call)
    answers: queue.SimpleQueue[CallAnswer] = queue.SimpleQueue()
    start_call(call, answers.put)
    return _response(_single(answers.get))


def _single(get: Callable[[], CallAnswer]) -> CallAnswer:
    """The one answer of a call that is not decoupled (the final one)."""
    answer = get()
    while not answer.final:  # a decoupled callee streamed: the server refuses that
        answer = get()
    return answer


def async_exec(request: Any, decoupled: bool) -> asyncio.Future[Any]:
    """``InferenceRequest.async_exec``: a future of the running loop (as Triton's).

    The call is sent at once; no thread waits for it. Decoupled, the future holds the
    :class:`ResponseIterator` at once (Triton's ``async_exec(decoupled=True)`` also
    resolves to an iterator that is read synchronously).
    """
    loop = asyncio.get_running_loop()
    call = build_call(request, decoupled)
    future: asyncio.Future[Any] = loop.create_future()
    if decoupled:
        future.set_result(ResponseIterator(call))
        return future

    def settle(answer: CallAnswer) -> None:
        if not future.done():
            future.set_result(_response(answer))

    def on_answer(answer: CallAnswer) -> None:
        if answer.final:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(settle, answer)

    cancel = start_call(call, on_answer)
    future.add_done_callback(lambda f: cancel() if f.cancelled() else None)
    return future


# -- ``async def execute``: run the coroutine on this process's own loop ---------------

_LOOP: asyncio.AbstractEventLoop | None = None


def run_coroutine(coroutine: Any, state: Executing) -> Any:
    """Run ``execute``'s coroutine to its end on the process's model loop; return its value.

    As Triton's stub does, one event loop (in a thread of its own) runs every
    coroutine ``execute`` returns, so tasks a model leaves running carry on between
    batches. The coroutine runs with ``state`` as what executes (its BLS calls carry
    the batch's facts).
    """
    loop = _model_loop()

    async def under_state() -> Any:
        with executing(state):
            return await coroutine

    return asyncio.run_coroutine_threadsafe(under_state(), loop).result()


def _model_loop() -> asyncio.AbstractEventLoop:
    global _LOOP
    with _LOCK:
        if _LOOP is None or _LOOP.is_closed():
            loop = asyncio.new_event_loop()
            threading.Thread(
                target=loop.run_forever, name="sordino-python-model-loop", daemon=True
            ).start()
            _LOOP = loop
        return _LOOP
