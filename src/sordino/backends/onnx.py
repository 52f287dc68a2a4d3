"""The ONNX Runtime backend: one InferenceSession per model instance."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from sordino.backends.base import BackendStatistics, ModelMetadata, TensorSpec
from sordino.datatypes import from_onnx_type
from sordino.errors import ModelLoadError
from sordino.inference import Tensor

__all__ = ["OnnxBackend", "available_providers"]

PLATFORM = "onnxruntime_onnx"


def available_providers() -> list[str]:
    """Return the execution providers this onnxruntime build offers."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def _dims(shape: list[Any]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


class OnnxBackend:
    """Runs an ONNX model through ONNX Runtime.

    ``providers`` are tried in order (ONNX Runtime falls back along the list);
    asking for one this build does not have is a load error, never silently ignored.
    """

    def __init__(
        self,
        *,
        name: str,
        version: str,
        providers: list[str] | None = None,
        intra_op_threads: int | None = None,
    ) -> None:
        self._name = name
        self._version = version
        self._providers = providers or ["CPUExecutionProvider"]
        self._intra_op_threads = intra_op_threads
        self._session: Any = None
        self._metadata: ModelMetadata | None = None
        self._string_inputs: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._batches = self._items = self._failures = 0
        self._busy = 0.0

    @property
    def metadata(self) -> ModelMetadata:
        if self._metadata is None:
            raise ModelLoadError(f"model {self._name} is not loaded")
        return self._metadata

    def load(self, model_path: Path, device: str = "cpu") -> None:
        import onnxruntime as ort

        missing = [p for p in self._providers if p not in ort.get_available_providers()]
        if missing:
            raise ModelLoadError(
                f"model {self._name}: execution provider(s) {', '.join(missing)} are not "
                f"available in this onnxruntime build (available: "
                f"{', '.join(ort.get_available_providers())}); install the matching onnxruntime "
                "package or remove them from execution_providers"
            )
        options = ort.SessionOptions()
        if self._intra_op_threads:
            options.intra_op_num_threads = self._intra_op_threads
        options.log_severity_level = 3
        provider_options: list[dict[str, str]] = []
        for provider in self._providers:
            opts: dict[str, str] = {}
            if provider in ("CUDAExecutionProvider", "TensorrtExecutionProvider") and ":" in device:
                opts["device_id"] = device.split(":", 1)[1]
            provider_options.append(opts)
        try:
            session = ort.InferenceSession(
                str(model_path),
                sess_options=options,
                providers=self._providers,
                provider_options=provider_options,
            )
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelLoadError(f"model {self._name}: cannot load {model_path}: {exc}") from exc
        inputs = tuple(
            TensorSpec(i.name, from_onnx_type(i.type), _dims(i.shape)) for i in session.get_inputs()
        )
        outputs = tuple(
            TensorSpec(o.name, from_onnx_type(o.type), _dims(o.shape))
            for o in session.get_outputs()
        )
        batched = all(spec.shape and spec.shape[0] == -1 for spec in inputs + outputs)
        self._session = session
        self._string_inputs = frozenset(s.name for s in inputs if s.datatype == "BYTES")
        self._metadata = ModelMetadata(
            name=self._name,
            version=self._version,
            platform=PLATFORM,
            inputs=inputs,
            outputs=outputs,
            batched=batched,
        )

    def infer(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        session = self._session
        if session is None:
            raise ModelLoadError(f"model {self._name} is not loaded")
        feed = {
            name: _to_str_array(arr) if name in self._string_inputs else arr
            for name, arr in batch.items()
        }
        start = time.perf_counter()
        try:
            results = session.run(None, feed)
        except Exception:
            with self._lock:
                self._failures += 1
            raise
        elapsed = time.perf_counter() - start
        rows = int(next(iter(batch.values())).shape[0]) if batch else 0
        with self._lock:
            self._batches += 1
            self._items += rows
            self._busy += elapsed
        return {spec.name: arr for spec, arr in zip(self.metadata.outputs, results, strict=True)}

    def unload(self) -> None:
        self._session = None

    def replace_session(self, session: Any) -> Any:
        """Serve later batches from ``session`` (same model; e.g. with profiling on).

        Returns the session it replaces, to be put back the same way. A batch already
        running finishes on the session it started with.
        """
        previous, self._session = self._session, session
        return previous

    def statistics(self) -> BackendStatistics:
        with self._lock:
            return BackendStatistics(self._batches, self._items, self._failures, self._busy)


def _to_str_array(arr: Tensor) -> Tensor:
    # onnxruntime's string tensors take str objects; bytes would be stringified as "b'...'".
    flat = [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in arr.reshape(-1)]
    return np.array(flat, dtype=object).reshape(arr.shape)
