"""Tensor lifetime planning for multi-step requests: one region, greedy by size.

A streaming or iterative request runs step after step; step ``k``'s outputs are
read by step ``k + 1`` and by nobody after (the scheduler releases them once the next
step consumed them and the response carrying them was written). Laid out naively,
every step's tensors would need their own bytes: the sum grows with the steps. Laid
out by lifetime, tensors whose lifetimes do not overlap share bytes, and a whole
request's steps fit one region about two steps large.

:func:`plan_greedy_by_size` is the "greedy by size" offset planner of TensorFlow
Lite's memory planner (Pisarchyk & Lee, "Efficient Memory Management for Deep
Neural Net Inference", 2020): tensors are placed largest first, each at the lowest
offset where it fits among the tensors already placed whose lifetimes overlap its own
(the smallest gap that holds it, else above them all). :func:`step_tensors` turns a
request's step sizes into tensors with lifetimes; :class:`StepPlanner` keeps, per
model, the planned region and the naive sum of the last request and the largest
planned region so far (``sordino memory status``, ``sordino_memory_plan_*``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sordino.inference import ModelKey
from sordino.memory.allocator import ALIGNMENT
from sordino.records import RequestDone, StepPlanStatistics

__all__ = ["Planned", "StepPlanner", "plan_greedy_by_size", "step_tensors"]


@dataclass(frozen=True, slots=True)
class Planned:
    """One tensor: its size, the first and last step that use it, and its offset."""

    size: int
    first: int
    last: int
    offset: int


def _align(nbytes: int) -> int:
    return -(-nbytes // ALIGNMENT) * ALIGNMENT


def plan_greedy_by_size(tensors: Sequence[tuple[int, int, int]]) -> tuple[list[Planned], int]:
    """Offsets for ``(size, first step, last step)`` tensors; return them and the peak.

    Two tensors whose step ranges overlap never overlap in bytes; the peak is the
    region's size (the end of the highest tensor). Sizes are aligned as the arena
    aligns blocks.
    """
    sized = [(_align(size), first, last) for size, first, last in tensors]
    order = sorted(range(len(sized)), key=lambda i: (-sized[i][0], sized[i][1], i))
    placed: list[Planned] = []
    result: dict[int, Planned] = {}
    for i in order:
        size, first, last = sized[i]
        live = sorted(
            (p for p in placed if p.first <= last and first <= p.last), key=lambda p: p.offset
        )
        best: int | None = None
        best_gap = 0
        end = 0
        for other in live:
            gap = other.offset - end
            if gap >= size and (best is None or gap < best_gap):
                best, best_gap = end, gap
            end = max(end, other.offset + other.size)
        planned = Planned(size, first, last, end if best is None else best)
        placed.append(planned)
        result[i] = planned
    plan = [result[i] for i in range(len(sized))]
    return plan, max((p.offset + p.size for p in plan), default=0)


def step_tensors(steps: Sequence[tuple[int, int]]) -> list[tuple[int, int, int]]:
    """The tensors of a request whose step ``k`` read ``steps[k][0]`` bytes of inputs
    and wrote ``steps[k][1]`` bytes of outputs, with their lifetimes.

    The request's own inputs live for the whole request; step ``k``'s outputs live
    from step ``k`` until step ``k + 1`` consumed them; input bytes of a later step
    beyond what the previous step carried (a sampler's new state) live for that step.
    """
    if not steps:
        return []
    last = len(steps) - 1
    tensors = [(steps[0][0], 0, last)]
    for k, (inputs, outputs) in enumerate(steps):
        if k > 0 and inputs > steps[k - 1][1]:
            tensors.append((inputs - steps[k - 1][1], k, k))
        tensors.append((outputs, k, min(k + 1, last)))
    return [t for t in tensors if t[0] > 0]


class StepPlanner:
    """Plans every finished multi-step request and keeps the figures per model.

    A scheduler observer: it reads :attr:`RequestDone.step_bytes`; one-shot requests
    (no step sizes) are ignored.
    """

    def __init__(self) -> None:
        # model name -> [requests, steps, planned, naive, max planned,
        #                region, region peak, region fallbacks, regions]
        self._models: dict[str, list[int]] = {}

    def request_done(self, done: RequestDone) -> None:
        if len(done.step_bytes) < 2 or done.outcome != "success":
            return
        tensors = step_tensors(done.step_bytes)
        _, peak = plan_greedy_by_size(tensors)
        naive = sum(_align(size) for size, _, _ in tensors)
        entry = self._models.setdefault(done.model.name, [0] * 9)
        entry[0] += 1
        entry[1:4] = [len(done.step_bytes), peak, naive]
        entry[4] = max(entry[4], peak)
        if done.region:  # what the request's output region really held (memory/region.py)
            entry[5:8] = list(done.region)
            entry[8] += 1

    def batch_done(self, done: object) -> None:
        """Batches say nothing about a request's steps."""

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        """Queues say nothing about a request's steps."""

    def statistics(self) -> tuple[StepPlanStatistics, ...]:
        return tuple(
            StepPlanStatistics(model, *entry) for model, entry in sorted(self._models.items())
        )
