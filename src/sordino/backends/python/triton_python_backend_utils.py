"""``triton_python_backend_utils`` as sordino gives it to a Triton Python model.

A Triton Python model does ``import triton_python_backend_utils as pb_utils``; the
Python backend (:mod:`sordino.backends.python.backend`) puts this module in
``sys.modules`` under that name before it imports ``model.py``. The names, signatures
and behaviour follow Triton's Python backend (r24.10, Triton 2.51), so a model written
for Triton runs unchanged. What sordino does not offer raises a clear error:
decoupled response senders. BLS (``InferenceRequest.exec``/``async_exec``) is
:mod:`sordino.backends.python.bls`.

Custom metrics (:class:`MetricFamily`) are kept in this process; after a batch that
changed them the backend calls :func:`publish_metrics`, which writes their snapshot
where the server's ``/metrics`` reads it (``sordino.telemetry.model_metrics``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "COUNTER",
    "GAUGE",
    "HISTOGRAM",
    "TRITONSERVER_MEMORY_CPU",
    "TRITONSERVER_MEMORY_GPU",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_END",
    "TRITONSERVER_REQUEST_FLAG_SEQUENCE_START",
    "TRITONSERVER_RESPONSE_COMPLETE_FINAL",
    "InferenceRequest",
    "InferenceResponse",
    "InferenceTrace",
    "Logger",
    "MetricFamily",
    "ModelConfig",
    "PreferredMemory",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "get_input_config_by_name",
    "get_input_tensor_by_name",
    "get_output_config_by_name",
    "get_output_tensor_by_name",
    "metric_snapshot",
    "numpy_to_triton_type",
    "publish_metrics",
    "triton_string_to_numpy",
]

TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2

COUNTER = "COUNTER"
GAUGE = "GAUGE"
HISTOGRAM = "HISTOGRAM"

_NUMPY = {
    "TYPE_BOOL": np.bool_,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}


def triton_string_to_numpy(triton_type_string: str) -> type:
    """The numpy type of a Triton data type name (``"TYPE_FP32"`` -> ``np.float32``)."""
    try:
        return _NUMPY[triton_type_string]
    except KeyError:
        raise TritonModelException(f"unknown Triton data type {triton_type_string!r}") from None


def numpy_to_triton_type(data_type: Any) -> str | None:
    """The Triton data type name of a numpy type, or None."""
    dtype = np.dtype(data_type)
    if dtype.kind in "OSU":
        return "TYPE_STRING"
    for name, numpy_type in _NUMPY.items():
        if numpy_type is not np.object_ and np.dtype(numpy_type) == dtype:
            return name
    return None


class TritonError:
    """An error to put in an :class:`InferenceResponse`."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r})"


class TritonModelException(Exception):
    """Raised by the utilities when a model uses them wrongly."""

    def message(self) -> str:
        return str(self)


class Tensor:
    """A named tensor: an input of a request, or an output a model gives."""

    def __init__(self, name: str, data: Any) -> None:
        array = np.asarray(data)
        if array.dtype.kind in "SU":
            array = array.astype(np.object_)
        self._name = name
        self._array = array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray[Any, Any]:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> str | None:
        return numpy_to_triton_type(self._array.dtype)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the data (numpy's; strings have none)."""
        if self._array.dtype == np.object_:
            raise TritonModelException(f"tensor {self._name}: a string tensor has no DLPack form")
        return self._array.__dlpack__()

    @staticmethod
    def from_dlpack(name: str, dlpack: Any) -> Tensor:
        """A tensor over a DLPack producer (an object with ``__dlpack__``) or capsule."""
        source = dlpack if hasattr(dlpack, "__dlpack__") else _Capsule(dlpack)
        return Tensor(name, np.from_dlpack(source))


class _Capsule:
    """A bare DLPack capsule as numpy's ``from_dlpack`` takes producers (CPU only)."""

    def __init__(self, capsule: Any) -> None:
        self._capsule = capsule

    def __dlpack__(self, *args: Any, **kwargs: Any) -> Any:
        return self._capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


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
        parameters: Mapping[str, Any] | str | None = None,
        preferred_memory: PreferredMemory | None = None,
        trace: InferenceTrace | None = None,
    ) -> None:
        if not isinstance(correlation_id, int | str):
            raise TritonModelException("Correlation ID must be integer or string")
        self.model_name = model_name
        self._inputs = list(inputs)
        self._outputs = list(requested_output_names)
        self._id = request_id
        self._correlation = correlation_id
        self._flags = flags
        self._timeout = timeout
        self._version = model_version
        self._memory = preferred_memory or PreferredMemory(_MEMORY_DEFAULT)
        self._trace = trace or InferenceTrace()
        if isinstance(parameters, str):
            self._parameters = parameters
        else:
            # Most requests carry none: skip the encoder (it showed in profiles).
            self._parameters = json.dumps(dict(parameters)) if parameters else "{}"
        self._cancelled: Callable[[], bool] = lambda: False

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

    def timeout(self) -> int:
        return self._timeout

    def model_version(self) -> int | str:
        return self._version

    def preferred_memory(self) -> PreferredMemory:
        return self._memory

    def trace(self) -> InferenceTrace:
        return self._trace

    def parameters(self) -> str:
        """The request's parameters as a JSON string (Triton's form)."""
        return self._parameters

    def is_cancelled(self) -> bool:
        return self._cancelled()

    def get_response_sender(self) -> Any:
        raise TritonModelException(
            "get_response_sender is for decoupled models, which sordino's Python backend "
            "does not run yet; return one InferenceResponse per request from execute"
        )

    def exec(self, decoupled: bool = False) -> Any:
        """Run this request on its model and wait: an :class:`InferenceResponse` (its
        error set when the call failed), or with ``decoupled`` an iterator of them."""
        from sordino.backends.python.bls import run_exec

        return run_exec(self, decoupled)

    def async_exec(self, decoupled: bool = False) -> Any:
        """As :meth:`exec`, as an awaitable of the running event loop."""
        from sordino.backends.python.bls import async_exec

        return async_exec(self, decoupled)


class InferenceResponse:
    """The answer to one request: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: Sequence[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: Mapping[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors or [])
        self._error = error
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


def get_input_tensor_by_name(request: InferenceRequest, name: str) -> Tensor | None:
    """The input ``name`` of ``request``, or None."""
    return next((t for t in request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    """The output ``name`` of ``response``, or None."""
    return next((t for t in response.output_tensors() if t.name() == name), None)


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


class Logger:
    """Log lines of the model, in the worker's log (logger ``sordino.python_model``)."""

    INFO, WARNING, ERROR, VERBOSE = 0, 1, 2, 3
    _log = logging.getLogger("sordino.python_model")
    _LEVELS: ClassVar[dict[int, int]] = {
        0: logging.INFO,
        1: logging.WARNING,
        2: logging.ERROR,
        3: logging.DEBUG,
    }

    @classmethod
    def log(cls, message: str, level: int = 0) -> None:
        cls._log.log(cls._LEVELS.get(level, logging.INFO), "%s", message)

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.log(message, cls.INFO)

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.log(message, cls.WARNING)

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.log(message, cls.ERROR)

    @classmethod
    def log_verbose(cls, message: str) -> None:
        cls.log(message, cls.VERBOSE)


# --- custom metrics -------------------------------------------------------------------

_METRICS_LOCK = threading.Lock()
_FAMILIES: dict[str, MetricFamily] = {}
_CHANGED = threading.Event()
METRICS_DIR_ENV = "SORDINO_MODEL_METRICS_DIR"
"""Where snapshots go (set by the server; ``sordino.telemetry.model_metrics`` reads them)."""


class MetricFamily:
    """A custom metric family (Triton: shown in ``/metrics``; here, sordino's)."""

    COUNTER = COUNTER
    GAUGE = GAUGE
    HISTOGRAM = HISTOGRAM

    def __init__(self, name: str, description: str, kind: str) -> None:
        if kind not in (COUNTER, GAUGE, HISTOGRAM):
            raise TritonModelException(f"metric kind {kind!r}: use COUNTER, GAUGE or HISTOGRAM")
        with _METRICS_LOCK:
            known = _FAMILIES.get(name)
            if known is not None and known.kind != kind:
                raise TritonModelException(
                    f"metric family {name!r} exists with kind {known.kind}, not {kind}"
                )
            self.name: str = name
            self.kind: str = kind
            self.description: str = known.description if known is not None else description
            self._metrics: dict[tuple[tuple[str, str], ...], Metric] = (
                known._metrics if known is not None else {}
            )
            _FAMILIES.setdefault(name, self)

    def Metric(
        self, labels: Mapping[str, str] | None = None, buckets: Sequence[float] | None = None
    ) -> Metric:
        key = tuple(sorted((str(k), str(v)) for k, v in (labels or {}).items()))
        with _METRICS_LOCK:
            metric = self._metrics.get(key)
            if metric is None:
                if self.kind == HISTOGRAM and not buckets:
                    raise TritonModelException("a HISTOGRAM metric needs buckets")
                metric = self._metrics[key] = Metric(self.kind, dict(key), buckets)
        return metric


class Metric:
    """One labelled series of a :class:`MetricFamily`."""

    def __init__(self, kind: str, labels: dict[str, str], buckets: Sequence[float] | None) -> None:
        self.kind, self.labels = kind, labels
        self.buckets = sorted(buckets or ())
        self._value = 0.0
        self._counts = [0] * (len(self.buckets) + 1)
        self._sum = 0.0

    def increment(self, value: float) -> None:
        if self.kind == HISTOGRAM:
            raise TritonModelException("increment is not supported for a HISTOGRAM metric")
        if self.kind == COUNTER and value < 0:
            raise TritonModelException("a COUNTER cannot be incremented by a negative value")
        with _METRICS_LOCK:
            self._value += value
        _CHANGED.set()

    def set(self, value: float) -> None:
        if self.kind != GAUGE:
            raise TritonModelException("set is only supported for a GAUGE metric")
        with _METRICS_LOCK:
            self._value = float(value)
        _CHANGED.set()

    def observe(self, value: float) -> None:
        if self.kind != HISTOGRAM:
            raise TritonModelException("observe is only supported for a HISTOGRAM metric")
        with _METRICS_LOCK:
            index = next((i for i, b in enumerate(self.buckets) if value <= b), len(self.buckets))
            self._counts[index] += 1
            self._sum += value
        _CHANGED.set()

    def value(self) -> float:
        if self.kind == HISTOGRAM:
            raise TritonModelException("value is not supported for a HISTOGRAM metric")
        return self._value

    def state(self) -> dict[str, Any]:
        with _METRICS_LOCK:
            if self.kind == HISTOGRAM:
                return {"buckets": self.buckets, "counts": list(self._counts), "sum": self._sum}
            return {"value": self._value}


def metric_snapshot() -> list[dict[str, Any]]:
    """Every custom metric of this process: family, kind, description, series."""
    return [
        {
            "name": family.name,
            "kind": family.kind,
            "description": family.description,
            "series": [{"labels": m.labels, **m.state()} for m in family._metrics.values()],
        }
        for family in list(_FAMILIES.values())
    ]


def publish_metrics() -> None:
    """Write this process's metrics snapshot for the server, if any changed since the last.

    The file (``<pid>.json`` in the folder the server named) is replaced atomically, so
    a scrape never reads half of it. Without a folder (no server) nothing is written.
    """
    folder = os.environ.get(METRICS_DIR_ENV)
    if not folder or not _CHANGED.is_set():
        return
    _CHANGED.clear()
    path = os.path.join(folder, f"{os.getpid()}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        json.dump(metric_snapshot(), out)
    os.replace(path + ".tmp", path)


# --- auto_complete_config -------------------------------------------------------------


class ModelConfig:
    """The configuration ``auto_complete_config`` reads and completes."""

    def __init__(self, model_config: Mapping[str, Any]) -> None:
        self._config: dict[str, Any] = json.loads(json.dumps(dict(model_config)))
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(self._config))
        return copy

    def set_max_batch_size(self, max_batch_size: int) -> None:
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def add_input(self, input: Mapping[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: Mapping[str, Any]) -> None:
        self._add("output", output)

    def _add(self, key: str, entry: Mapping[str, Any]) -> None:
        if "name" not in entry:
            raise TritonModelException(f"an {key} needs a name")
        for known in self._config[key]:
            if known["name"] == entry["name"]:
                for field in ("data_type", "dims"):
                    if field in known and field in entry and known[field] != entry[field]:
                        raise TritonModelException(
                            f"{key} {entry['name']!r}: {field} {entry[field]} differs from "
                            f"the configured {known[field]}"
                        )
                known.update({k: v for k, v in entry.items() if k not in known})
                return
        self._config[key].append(dict(entry))
