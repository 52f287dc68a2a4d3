"""Calls from a model to other models of the same server (Triton's BLS), backend side.

A model's code may ask the server that runs it for an inference on another model
(Triton's Python backend: ``pb_utils.InferenceRequest(...).exec()``). The backend
knows nothing of queues, tenants or sockets: it builds a :class:`ModelCall` and hands
it to the :class:`ModelCaller` the runtime gave it (:class:`CallingBackend`); the
answers come back, from any thread, as :class:`CallAnswer` records, the last one
marked ``final``. The runtime carries the call to the server's one request path, so
admission, batching, priorities, deadlines, quotas and breakers apply as to a
client's request:

- in a worker process, over the worker's pipe (``execution/worker_main.py``);
- in a thread instance, onto the server's event loop (``execution/thread_instance.py``).

The records are plain data (numpy arrays, strings, numbers) and cross the worker pipe
pickled.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sordino.inference import Tensor

__all__ = [
    "CallAnswer",
    "CallingBackend",
    "ModelCall",
    "ModelCaller",
    "failed_answer",
]


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One inference a model asks of another model of the same server.

    ``version`` empty means the latest. ``outputs`` empty means every output.
    ``priority`` (a level, 1 highest), ``deadline`` (absolute ``time.time()``) and
    ``tenant`` are those of the request the calling model was executing (None: not
    known); ``timeout_us`` is the call's own queue timeout (Triton's ``timeout``, 0:
    none). ``decoupled`` asks for every response of a decoupled model as it comes.
    ``caller`` names the calling model (a cycle back to it is detected).

    ``control`` makes it a call of Triton's model loading API instead of an inference
    (``pb_utils.load_model``, ``unload_model``, ``is_model_ready``): ``"load"`` (with
    ``parameters`` ``config``, JSON text, and ``files``, ``{"file:1/model.py": bytes}``),
    ``"unload"`` (``unload_dependents``) or ``"ready"`` (answered with the
    ``ready`` parameter); ``inputs`` is empty.
    """

    model: str
    inputs: Mapping[str, Tensor]
    version: str = ""
    outputs: tuple[str, ...] = ()
    request_id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    priority: int | None = None
    deadline: float | None = None
    tenant: str | None = None
    timeout_us: int = 0
    decoupled: bool = False
    caller: str = ""
    control: str = ""


@dataclass(frozen=True, slots=True)
class CallAnswer:
    """One response to a :class:`ModelCall`: outputs, or an error; ``final`` ends the call.

    ``code`` names the error's kind in Triton's terms (``TritonError`` attribute names:
    ``INTERNAL``, ``NOT_FOUND``, ``INVALID_ARG``, ``UNAVAILABLE``, ``UNSUPPORTED``,
    ``CANCELLED``); empty when there is no error. A final answer may carry no outputs
    (a decoupled model's stream ended without a last response).
    """

    outputs: Mapping[str, Tensor] = field(default_factory=dict)
    error: str = ""
    code: str = ""
    final: bool = True
    parameters: Mapping[str, Any] = field(default_factory=dict)


def failed_answer(message: str, code: str = "INTERNAL") -> CallAnswer:
    """The final answer of a call that failed with ``message``."""
    return CallAnswer(error=message, code=code or "INTERNAL", final=True)


class ModelCaller(Protocol):
    """Carries calls from a backend's model code to the server."""

    def start(self, call: ModelCall, on_answer: Callable[[CallAnswer], None]) -> Callable[[], None]:
        """Send ``call``; ``on_answer`` gets each answer (from any thread), the last one
        ``final``. Returns a function that gives the call up: the server cancels it and
        ``on_answer`` gets a final answer if it had none yet. Never raises for the
        call's own failure: that comes as an answer."""
        ...


@runtime_checkable
class CallingBackend(Protocol):
    """A backend whose model code may call other models (the runtime gives it a caller)."""

    def set_caller(self, caller: ModelCaller | None) -> None:
        """Use ``caller`` for the model's calls from now on (None: calls fail, saying so)."""
        ...
