"""Work items: what the scheduler queues, batches and completes.

A work item is one request for a one-shot model. Later, for iterative (diffusion)
models, it is one denoising step of one request; batching, priorities, deadlines and
fairness act on work items, so step-level batching needs no second scheduler.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from sordino.inference import Tensor

__all__ = ["Signature", "WorkItem", "signature_of"]

# (input name, numpy dtype string, shape of one batch item) for every input, sorted by name.
Signature = tuple[tuple[str, str, tuple[int, ...]], ...]

_sequence = itertools.count()


def signature_of(inputs: dict[str, Tensor], batched: bool) -> Signature:
    """Return what must match for two work items to share a batch."""
    return tuple(
        sorted(
            (name, arr.dtype.str, tuple(arr.shape[1:] if batched else arr.shape))
            for name, arr in inputs.items()
        )
    )


@dataclass(eq=False, slots=True)
class WorkItem:
    """One unit of schedulable work and the future its result is delivered to.

    ``rows`` is the item's extent along the batch dimension. ``deadline`` is on the
    scheduler's clock, or None for no deadline. ``delayed`` is set when the item's
    deadline passed under the DELAY timeout action: it stays queued but yields to
    items that have not expired.
    """

    inputs: dict[str, Tensor]
    rows: int
    signature: Signature
    priority: int
    arrival: float
    future: asyncio.Future[dict[str, Tensor]]
    deadline: float | None = None
    request_id: str | None = None
    delayed: bool = False
    dispatched_at: float | None = None
    seq: int = field(default_factory=lambda: next(_sequence))
