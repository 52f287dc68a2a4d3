"""Operator profiling of one model's instances, in worker processes or on threads.

:func:`profile_instances` turns ONNX Runtime's profiler on in every serving instance
of a model (a worker process swaps its session when it is between batches; a thread
instance swaps its backend's session), lets live batches run for the window, runs
zero-filled batches on the profiling instances when no live batch ran, and turns
profiling off again, collecting one trace file per instance.

An instance lost during the window (its worker killed, crashed or hung) loses its
trace: the other instances still count and the lost one is named, with its cause,
in :attr:`ProfileTraces.lost`. When no instance could be profiled the call fails with
:class:`Unavailable`. Every step is bounded: a lost worker fails its commands at
once, and a worker that does not answer a command fails it after
``workers.start_timeout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sordino.clock import Clock
from sordino.errors import SordinoError, Unavailable
from sordino.execution.worker import WorkerError, WorkerLost

__all__ = ["SYNTHETIC_BATCHES", "ProfileTraces", "Profiled", "profile_instances"]

SYNTHETIC_BATCHES = 20


class Profiled(Protocol):
    """An instance that can be profiled (``ProcessInstance``, ``ThreadInstance``)."""

    batches: int

    @property
    def subject(self) -> str: ...

    @property
    def profiling(self) -> bool: ...

    async def start_profiling(self, prefix: str) -> None: ...

    async def stop_profiling(self) -> tuple[str, int]: ...


@dataclass(frozen=True, slots=True)
class ProfileTraces:
    """What a profiling window left behind.

    ``paths``: one ONNX Runtime trace file per instance profiled to the end;
    ``batches``: the batches those instances ran on their profiling sessions;
    ``synthetic``: no live batch ran, so zero-filled ones were profiled;
    ``lost``: ``"model/N: cause"`` for each instance whose trace was lost.
    """

    paths: tuple[Path, ...]
    batches: int
    synthetic: bool
    lost: tuple[str, ...]


def _cause(exc: BaseException) -> str:
    if isinstance(exc, WorkerLost):
        return exc.cause
    if isinstance(exc, WorkerError | SordinoError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


async def profile_instances(
    model: str,
    instances: Sequence[Profiled],
    *,
    seconds: float,
    trace_dir: Path,
    clock: Clock,
    run_synthetic: Callable[[Profiled], Awaitable[object]],
) -> ProfileTraces:
    """Profile ``instances`` for ``seconds`` on ``clock``; trace files go to ``trace_dir``.

    ``run_synthetic(instance)`` runs one zero-filled batch on that instance; it is
    called :data:`SYNTHETIC_BATCHES` times, round robin over the instances still
    profiling, when no live batch ran in the window. Raises :class:`Unavailable`
    when no instance left a trace.
    """
    lost: list[str] = []
    profiling: list[Profiled] = []
    stopped: list[tuple[str, int] | BaseException] = []
    synthetic = False
    try:
        started = await asyncio.gather(
            *(
                instance.start_profiling(str(trace_dir / instance.subject.replace("/", "-")))
                for instance in instances
            ),
            return_exceptions=True,
        )
        for instance, result in zip(instances, started, strict=True):
            if isinstance(result, BaseException):
                lost.append(f"{instance.subject}: {_cause(result)}")
            else:
                profiling.append(instance)
        if profiling:
            before = sum(instance.batches for instance in profiling)
            await clock.sleep(seconds)
            synthetic = sum(instance.batches for instance in profiling) == before
            if synthetic:
                await _synthetic(profiling, run_synthetic)
    finally:
        # After a cancelled start, stop whatever did start.
        ending = profiling or [instance for instance in instances if instance.profiling]
        stopped = await asyncio.gather(
            *(instance.stop_profiling() for instance in ending), return_exceptions=True
        )
    paths: list[Path] = []
    batches = 0
    for instance, outcome in zip(profiling, stopped, strict=True):
        if isinstance(outcome, BaseException):
            lost.append(f"{instance.subject}: {_cause(outcome)}")
            continue
        path, count = outcome
        paths.append(Path(path))
        batches += count
    if not paths:
        detail = "; ".join(lost) or "it has no instance"
        raise Unavailable(f"could not profile model {model}: {detail}")
    return ProfileTraces(tuple(paths), batches, synthetic, tuple(lost))


async def _synthetic(
    profiling: Sequence[Profiled], run: Callable[[Profiled], Awaitable[object]]
) -> None:
    for n in range(SYNTHETIC_BATCHES):
        alive = [instance for instance in profiling if instance.profiling]
        if not alive:
            return  # every profiled instance is gone; stopping says why
        try:
            await run(alive[n % len(alive)])
        except (WorkerLost, WorkerError, SordinoError):
            continue  # a lost instance is reported when it is stopped
