"""``triton_python_backend_utils`` as sordino gives it to a Triton Python model.

A Triton Python model does ``import triton_python_backend_utils as pb_utils``; the
Python backend (:mod:`sordino.backends.python.backend`) puts this module in
``sys.modules`` under that name before it imports ``model.py``. The names, signatures
and behaviour follow Triton's Python backend (r24.10, Triton 2.51), so a model written
for Triton runs unchanged; what sordino does not offer raises a clear error.
BLS (``InferenceRequest.exec``/``async_exec``) is :mod:`sordino.backends.python.bls`.

A request's :class:`InferenceResponseSender` (``get_response_sender()``) sends its
responses as Triton's does: any number with a decoupled model, exactly one without;
the backend (``backends/python/decoupled.py``) says where they go.

Custom metrics (:class:`MetricFamily`) are kept in this process; after a batch that
changed them the backend calls :func:`publish_metrics`, which writes their snapshot
where the server's ``/metrics`` reads it (``sordino.telemetry.model_metrics``).

Here: the tensors, requests, responses and their sender, and the type and config
helpers; the errors are ``triton_errors.py``'s, ``Logger`` ``model_logger.py``'s, the
custom metrics ``model_metrics.py``'s, ``ModelConfig`` ``model_config.py``'s and the
model loading API (``load_model``, ``unload_model``, ``is_model_ready``)
``model_loading.py``'s, every name importable from this module as in Triton's.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sordino.backends.python import bls
from sordino.backends.python.model_config import ModelConfig
from sordino.backends.python.model_dir import get_model_dir
from sordino.backends.python.model_loading import is_model_ready, load_model, unload_model
from sordino.backends.python.model_logger import Logger
from sordino.backends.python.model_metrics import (
    COUNTER,
    GAUGE,
    HISTOGRAM,
    MetricFamily,
    metric_snapshot,
    publish_metrics,
)
from sordino.backends.python.model_metrics import (
    METRICS_DIR_ENV as METRICS_DIR_ENV,  # public before the split; kept importable
)
from sordino.backends.python.model_metrics import (
    Metric as Metric,  # public before the split; kept importable
)
from sordino.backends.python.triton_errors import TritonError, TritonModelException
from sordino.backends.python.triton_tensor import Tensor
from sordino.backends.python.triton_types import (
    TRITON_STRING_TO_NUMPY,
    deserialize_bytes_tensor,
    numpy_to_triton_type,
    serialize_byte_tensor,
    triton_string_to_numpy,
    triton_to_numpy_type,
)

__all__ = [
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_REQUEST_RELEASE_ALL",
    "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "TRITON_STRING_TO_NUMPY",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "InferenceTrace",
    "Logger",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "deserialize_bytes_tensor",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_model_dir",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "is_model_ready",
    "load_model",
    "metric_snapshot",
    "numpy_to_triton_type",
    "publish_metrics",
    "serialize_byte_tensor",
    "triton_string_to_numpy",
    "triton_to_numpy_type",
    "unload_model",
    "using_decoupled_model_transaction_policy",
]

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2


TRITONSERVER_MEMORY_GPU = 1
TRITONSERVER_MEMORY_CPU = 0
_MEMORY_DEFAULT = -1


class PreferredMemory:
    """Where a BLS call would like its outputs (Triton's ``PreferredMemory``).

    sordino keeps every tensor in CPU memory: a BLS call asking for GPU memory is
    refused, saying so.
    """

    def __init__(self, preferred_memory_type: int, preferred_device_id: int = 0) -> None:
        self.preferred_memory_type = preferred_memory_type
        self.preferred_device_id = preferred_device_id


class InferenceTrace:
    """A request's trace (Triton's); sordino has no Triton tracing, so it has no context."""

    def get_context(self) -> str | None:
        return None


class InferenceRequest:
    """A request ``execute`` gets, or one a model makes to another model (BLS).

    The BLS form is Triton's: ``InferenceRequest(model_name=..., inputs=[Tensor...],
    requested_output_names=[...])`` then :meth:`exec` or :meth:`async_exec` (see
    :mod:`sordino.backends.python.bls`).
    """

    def __init__(
        self,
        model_name: str | bytes = "",
        requested_output_names: Sequence[str] = (),
        inputs: Sequence[Tensor] = (),
        request_id: str = "",
        correlation_id: int | str = 0,
        flags: int = 0,
        timeout: int = 0,
        model_version: int | str = -1,
        parameters: Mapping[str, bool | int | str] | None = None,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
    ) -> None:
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self.model_name = model_name
        self._inputs = list(inputs)
        self._outputs: Sequence[str] = list(requested_output_names)
        self._id = request_id
        self._correlation = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._version = model_version
        self._memory = preferred_memory
        self._trace = trace
        self._parameters: str = bls.parameters_text(parameters)
        self._cancelled: Callable[[], bool] = _never
        self._sender: InferenceResponseSender | None = None
        self._make_sender: Callable[[InferenceRequest], InferenceResponseSender] | None = None
        self._sordino_index = 0  # its place in execute's list (the backend's senders)
        self._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        self._sordino_priority: int | None = None
        self._sordino_deadline: float | None = None
        self._sordino_tenant: str | None = None

    @classmethod
    def _for_execute(
        cls, model_name: str, inputs: list[Tensor], requested_output_names: Sequence[str],
        request_id: str, correlation_id: int | str, flags: int, timeout: int, parameters: str,
    ) -> InferenceRequest:  # fmt: skip
        """A request ``execute`` gets, answering as ``InferenceRequest(...)``'s (``inputs``
        kept, not copied; ``requested_output_names`` may be shared: the accessor copies)."""
        request = cls.__new__(cls)
        request.model_name = model_name
        request._inputs = inputs
        request._outputs = requested_output_names
        request._id = request_id
        request._correlation = correlation_id
        request._flags = flags
        request._timeout = timeout
        request._version = -1
        request._memory = None
        request._trace = None
        request._parameters = parameters
        request._cancelled = _never
        request._sender = None
        request._make_sender = None
        request._sordino_index = 0
        request._release_flags = TRITONSERVER_REQUEST_RELEASE_ALL
        return request

    def inputs(self) -> list[Tensor]:
        return list(self._inputs)

    def requested_output_names(self) -> list[str]:
        return list(self._outputs)

    def request_id(self) -> str:
        return self._id

    def correlation_id(self) -> int | str:
        return self._correlation

    def flags(self) -> int:
        return self._flags

    def set_flags(self, flags: int) -> None:
        self._flags = flags

    def set_release_flags(self, flags: int) -> None:
        """``TRITONSERVER_REQUEST_RELEASE_ALL`` (the request ends with its response), or
        ``..._RESCHEDULE``: run the request again in a later batch once ``execute``
        returns (Triton's iterative sequences; ``execute`` then returns None in its
        place). The backend reads it when ``execute`` returns."""
        self._release_flags = flags

    def timeout(self) -> int:
        return self._timeout

    def model_version(self) -> int | str:
        return self._version

    def preferred_memory(self) -> PreferredMemory:
        memory = self._memory
        if memory is None:  # made on first use: most requests never ask
            memory = self._memory = PreferredMemory(_MEMORY_DEFAULT)
        return memory

    def trace(self) -> InferenceTrace:
        trace = self._trace
        if trace is None:  # made on first use: most requests never ask
            trace = self._trace = InferenceTrace()
        return trace

    def parameters(self) -> str:
        """The request's parameters as a JSON string (Triton's form)."""
        return self._parameters

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def get_response_sender(self) -> InferenceResponseSender:
        """The sender of this request's responses (the same one on every call)."""
        sender = self._sender
        if sender is None and self._make_sender is not None:
            # Made on first use (most models return responses); once, whichever threads ask.
            with _FIRST_SENDER:
                sender = self._sender
                if sender is None:
                    sender = self._sender = self._make_sender(self)
        if sender is None:
            raise TritonModelException(
                "this request has no response sender: only the requests execute receives "
                "send responses"
            )
        return sender

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model and wait: an :class:`InferenceResponse` (its
        error set when the call failed), or with ``decoupled`` an iterator of them."""
        from sordino.backends.python.bls import run_exec

        return run_exec(self, decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        """As :meth:`exec`, as an awaitable of the running event loop."""
        from sordino.backends.python.bls import async_exec

        return async_exec(self, decoupled)


_FIRST_SENDER = threading.Lock()
"""Held while a request's sender is made (on its first ``get_response_sender()``)."""


def _never() -> bool:
    """``is_cancelled()`` of a request nobody can cancel."""
    return False


class InferenceResponse:
    """The answer to one request: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: Mapping[str, bool | int | str] | None = None,
    ) -> None:
        if error is not None and not isinstance(error, TritonError):  # as Triton's refuses it
            raise TypeError(
                "InferenceResponse's error must be a pb_utils.TritonError (e.g. "
                f"pb_utils.TritonError('what went wrong')), not {type(error).__name__}"
            )
        self._outputs = list(output_tensors or [])
        self._error = error
        self._parameters: str
        if isinstance(parameters, str):
            self._parameters = parameters
        else:
            self._parameters = json.dumps(dict(parameters)) if parameters else "{}"

    def output_tensors(self) -> list[Tensor]:
        return list(self._outputs)

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        """The response's parameters as a JSON string (Triton's form)."""
        return self._parameters


class InferenceResponseSender:
    """Sends one request's responses, as Triton's response sender does.

    ``send(response, flags)``: ``flags`` is 0 or :data:`TRITONSERVER_RESPONSE_COMPLETE_FINAL`
    (the request's last; the response may then be None). With a decoupled model any
    number of responses may be sent, from any thread, until the final flag; without,
    exactly one response (with the final flag, or followed by it). Sending after the
    final flag, or after the batch failed, raises :class:`TritonModelException` with
    Triton's message.
    """

    def __init__(
        self,
        emit: Callable[[InferenceResponse | None, bool], None],
        cancelled: Callable[[], bool],
        *,
        decoupled: bool,
    ) -> None:
        self._emit = emit
        self._cancelled = cancelled
        self._decoupled = decoupled
        self._lock = threading.Lock()
        self._closed = False
        self._sent = 0

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if flags not in (0, TRITONSERVER_RESPONSE_COMPLETE_FINAL):
            raise TritonModelException("Unable to send response. Unsupported flag provided.")
        if flags == 0 and response is None:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set to zero."
            )
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        # Held while emitting: one request's responses leave in the order they were sent.
        with self._lock:
            if not self._decoupled:
                if response is not None and self._sent > 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send more "
                        "than one response."
                    )
                if response is None and final and self._sent == 0:
                    raise TritonModelException(
                        "Unable to send response. Non-decoupled model cannot send complete "
                        "final before sending a response."
                    )
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            self._emit(response, final)  # raises when it cannot leave: nothing was sent
            if final:
                self._closed = True
            self._sent += 1

    def is_cancelled(self) -> bool:
        """Whether the client cancelled the request (the model may stop sending)."""
        return self._cancelled()

    def close(self) -> None:
        """Send nothing more (the batch failed; its requests were answered the error)."""
        with self._lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __del__(self) -> None:
        # A decoupled request whose sender the model let go of before the final flag
        # could never end (Triton leaves it open): it ends here, with an error saying why.
        if self._decoupled and not self._closed:
            # What fails here had ended otherwise (the server stopping, the worker going).
            with contextlib.suppress(Exception):
                self._emit(InferenceResponse(error=TritonError(_ABANDONED)), True)


_ABANDONED = (
    "the model let go of this request's response sender without sending the final flag "
    "(send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)): its responses end here"
)


def using_decoupled_model_transaction_policy(model_config: Mapping[str, Any]) -> bool:
    """Whether ``model_config`` has ``model_transaction_policy { decoupled: true }``."""
    policy = model_config.get("model_transaction_policy") or {}
    return bool(policy.get("decoupled", False)) if isinstance(policy, Mapping) else False


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    """The input ``name`` of ``request``, or None."""
    # The request's own list when it is ours (inputs() copies it; this only reads).
    inputs = request._inputs if type(request) is InferenceRequest else request.inputs()
    for tensor in inputs:
        if tensor.name() == name:
            return tensor
    return None


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    """The output ``name`` of ``response``, or None."""
    ours = type(response) is InferenceResponse
    outputs = response._outputs if ours else response.output_tensors()
    for tensor in outputs:
        if tensor.name() == name:
            return tensor
    return None


def _config_by_name(model_config: Mapping[str, Any], key: str, name: str) -> Any:
    for entry in model_config.get(key, ()):
        if entry.get("name") == name:
            return entry
    return None


def get_input_config_by_name(model_config: Mapping[str, Any], name: str) -> Any:
    """The configuration of input ``name`` (a dict), or None."""
    return _config_by_name(model_config, "input", name)


def get_output_config_by_name(model_config: Mapping[str, Any], name: str) -> Any:
    """The configuration of output ``name`` (a dict), or None."""
    return _config_by_name(model_config, "output", name)
