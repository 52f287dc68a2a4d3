"""On-demand operator profiling of a served model with ONNX Runtime's profiler.

ONNX Runtime can only profile a session created with profiling on, so for the
profiling window each instance of the model serves from a second session on the
same file with ``enable_profiling`` set; afterwards the original sessions are put
back and the trace files are parsed into an :class:`OperatorProfile`. When no live
batch ran during the window, a few zero-filled batches are run so the breakdown
still exists, and the profile says it is ``synthetic``.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from sordino.clock import Clock
from sordino.errors import Unsupported
from sordino.inference import ModelKey, Tensor
from sordino.telemetry.profile_data import OperatorProfile, parse_ort_profile

__all__ = ["ProfilableBackend", "profile_model"]

SYNTHETIC_BATCHES = 20


class ProfilableBackend(Protocol):
    """A backend whose ONNX Runtime session can be swapped (``OnnxBackend``)."""

    def replace_session(self, session: Any) -> Any: ...

    def infer(self, batch: dict[str, Tensor]) -> dict[str, Tensor]: ...

    def statistics(self) -> Any: ...


def _profiling_session(
    model_path: Path, providers: list[str], threads: int | None, prefix: str
) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.enable_profiling = True
    options.profile_file_prefix = prefix
    options.log_severity_level = 3
    if threads:
        options.intra_op_num_threads = threads
    return ort.InferenceSession(str(model_path), sess_options=options, providers=providers)


def _end_profiling(sessions: list[Any]) -> list[list[dict[str, Any]]]:
    traces = []
    for session in sessions:
        path = Path(session.end_profiling())
        if path.is_file():
            traces.append(json.loads(path.read_text()))
    return traces


async def profile_model(
    model: ModelKey,
    *,
    model_path: Path,
    providers: Sequence[str],
    intra_op_threads: int | None,
    backends: Sequence[Any],
    seconds: float,
    synthetic_batch: Callable[[], dict[str, Tensor]],
    clock: Clock,
) -> OperatorProfile:
    """Profile ``model``'s live traffic for ``seconds`` and return the operator breakdown."""
    swappable = [b for b in backends if hasattr(b, "replace_session")]
    if not swappable:
        raise Unsupported(
            f"model {model} runs on a backend without ONNX Runtime sessions to profile"
        )
    loop = asyncio.get_running_loop()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="sordino-profile-") as tmp:
        sessions = [
            await loop.run_in_executor(
                None,
                _profiling_session,
                model_path,
                list(providers),
                intra_op_threads,
                str(Path(tmp) / f"{model.name}-{i}"),
            )
            for i in range(len(swappable))
        ]
        before = sum(b.statistics().batches for b in swappable)
        originals = [b.replace_session(s) for b, s in zip(swappable, sessions, strict=True)]
        try:
            await clock.sleep(seconds)
            batches = sum(b.statistics().batches for b in swappable) - before
            synthetic = batches == 0
            if synthetic:
                batch = synthetic_batch()
                for _ in range(SYNTHETIC_BATCHES):
                    await loop.run_in_executor(None, swappable[0].infer, batch)
        finally:
            for backend, original in zip(swappable, originals, strict=True):
                backend.replace_session(original)
        traces = await loop.run_in_executor(None, _end_profiling, sessions)
    return parse_ort_profile(
        traces,
        model=model.name,
        version=model.version,
        started_at=started,
        seconds=seconds,
        batches=SYNTHETIC_BATCHES if synthetic else batches,
        synthetic=synthetic,
    )
