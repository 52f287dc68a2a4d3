"""On-demand operator profiling of a served model with ONNX Runtime's profiler.

ONNX Runtime can only profile a session created with profiling on, so for the
profiling window each instance of the model serves from a second session on the
same file with profiling on, whether it runs in a worker process (the worker swaps
its session between batches when the server asks) or on a thread of the server;
afterwards the original sessions are put back (see ``execution/profiling.py``). The
trace files, written by whichever process ran the instance into a temporary
directory both can reach, are parsed here into an :class:`OperatorProfile`. When no
live batch ran during the window, zero-filled batches are profiled instead and the
profile says it is ``synthetic``.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from sordino.execution.profiling import ProfileTraces
from sordino.inference import ModelKey, Tensor
from sordino.telemetry.profile_data import OperatorProfile, parse_ort_profile

__all__ = ["ProfilingExecutor", "profile_model"]


class ProfilingExecutor(Protocol):
    """What profiling needs from the executor (``ChainExecutor.profile``)."""

    async def profile(
        self,
        model: ModelKey,
        *,
        seconds: float,
        trace_dir: Path,
        synthetic_batch: Callable[[], dict[str, Tensor]],
    ) -> ProfileTraces: ...


def _read_traces(paths: Sequence[Path]) -> list[list[dict[str, Any]]]:
    # ONNX Runtime names the file even when it could not write it: skip what is missing.
    return [json.loads(path.read_text()) for path in paths if path.is_file()]


async def profile_model(
    model: ModelKey,
    *,
    executor: ProfilingExecutor,
    seconds: float,
    synthetic_batch: Callable[[], dict[str, Tensor]],
) -> OperatorProfile:
    """Profile ``model``'s traffic for ``seconds`` and return the operator breakdown.

    Raises :class:`sordino.errors.Unavailable` when no instance of the model could be
    profiled to the end (each one lost, with its cause, in the message); instances
    lost while others finished are listed in the profile's ``lost``.
    """
    started = time.time()
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="sordino-profile-") as tmp:
        result = await executor.profile(
            model, seconds=seconds, trace_dir=Path(tmp), synthetic_batch=synthetic_batch
        )
        traces = await loop.run_in_executor(None, _read_traces, result.paths)
    return parse_ort_profile(
        traces,
        model=model.name,
        version=model.version,
        started_at=started,
        seconds=seconds,
        batches=result.batches,
        synthetic=result.synthetic,
        lost=result.lost,
    )
