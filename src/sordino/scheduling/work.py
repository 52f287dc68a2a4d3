"""What the scheduler owns: requests across their steps, and the work items it batches.

A :class:`Request` is created when the scheduler accepts a request and lives until its
last response, error or cancellation. A one-shot request has one step; a streaming
(step) model's request has one step per response, and between steps the scheduler
keeps its state: the tensors that feed the next step (the request's own inputs and
the outputs carried from the step before, still in the arena).

A :class:`WorkItem` is one step of one request waiting in the queue or running in a
batch. Batching, priorities, deadlines and fairness act on work items, so requests at
different steps share batches and a cancelled stream stops between steps, with no
second scheduler.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple, Protocol

from sordino.errors import SordinoError
from sordino.inference import RequestFacts, StreamSpec, Tensor
from sordino.memory.refs import Tensors
from sordino.memory.region import StepRegion
from sordino.records import Outcome

__all__ = [
    "Outbox",
    "Request",
    "RequestState",
    "Signature",
    "StepOutput",
    "Stepper",
    "WorkItem",
    "signature_of",
]

# (input name, numpy dtype string, shape of one batch item) for every input, sorted by name.
Signature = tuple[tuple[str, str, tuple[int, ...]], ...]

RequestState = Literal["queued", "running", "finished"]

_sequence = itertools.count()


def signature_of(inputs: Mapping[str, Tensor], batched: bool) -> Signature:
    """Return what must match for two work items to share a batch."""
    if len(inputs) == 1:  # the common case: nothing to sort
        for name, arr in inputs.items():
            return ((name, arr.dtype.str, tuple(arr.shape[1:] if batched else arr.shape)),)
    return tuple(
        sorted(
            (name, arr.dtype.str, tuple(arr.shape[1:] if batched else arr.shape))
            for name, arr in inputs.items()
        )
    )


class Outbox:
    """What the scheduler has for a request's one reader: step outputs, or the error.

    A deque and at most one waiting future: lighter than ``asyncio.Queue`` on a path
    taken once per request. A reader cancelled while waiting loses nothing.
    """

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque[StepOutput | SordinoError] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put_nowait(self, item: StepOutput | SordinoError) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> StepOutput | SordinoError:
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return self._items.popleft()

    def get_nowait(self) -> StepOutput | SordinoError:
        return self._items.popleft()

    def ready(self) -> asyncio.Future[None]:
        """A future set once an item is here: for a reader that waits by callback (no
        task) rather than in :meth:`get`; cancelling it loses nothing."""
        self._waiter = waiter = asyncio.get_running_loop().create_future()
        if self._items:
            waiter.set_result(None)
        return waiter

    def empty(self) -> bool:
        return not self._items

    def overflow(self, outputs: Mapping[str, Tensor]) -> str | None:
        """Why a response of ``outputs`` may not wait here for its reader (its reader is
        too far behind), or None: it may. An outbox without a budget takes all."""
        return None


class StepOutput(NamedTuple):
    """One step's outputs for one request; the receiver owns (and releases) ``outputs``."""

    outputs: Tensors
    final: bool
    step: int
    empty: bool = False
    """True for the end of a decoupled request whose last step sent no response."""
    error: SordinoError | None = None
    """A decoupled model's error response that is not its last (``outputs`` is empty):
    one response of the stream, as on Triton. A request's last error is not a step: the
    request fails with it."""


class Stepper(Protocol):
    """The runtime side of an iterative request: what the next step is, computed between steps.

    The scheduler calls :meth:`advance` with each step's outputs (which it owns) and
    the time; it returns the next step's inputs (None: the request is done) and what
    to deliver to the reader now (None: nothing for this step). The scheduler owns
    both returned ``Tensors``. :meth:`close` is called once when the request ends, on
    any outcome, so the stepper lets go of state it keeps.
    """

    def advance(self, outputs: Tensors, now: float) -> tuple[Tensors | None, Tensors | None]: ...

    def close(self) -> None: ...


class Stamps(Protocol):
    """A request's trace, as the scheduler stamps it (``server/tracing.Trace``)."""

    def stamp(self, name: str, ns: int | None = None) -> None: ...


@dataclass(eq=False, slots=True)
class Request:
    """One accepted request, owned by its model's scheduler until it finishes.

    ``inputs`` are the request's own tensors (released when it finishes); ``stream`` is
    the step model's spec, or None for a one-shot request. ``outputs`` carries each
    step's :class:`StepOutput` (or the error that ended the request) to whoever reads
    the responses. ``queue_s`` and ``compute_s`` add up over the steps.
    """

    inputs: Tensors
    priority: int
    arrival: float
    timeout_s: float | None = None
    id: str | None = None
    stream: StreamSpec | None = None
    stepper: Stepper | None = None
    state: RequestState = "queued"
    outcome: Outcome | None = None
    steps: int = 0
    queue_s: float = 0.0
    compute_s: float = 0.0
    item: WorkItem | None = None
    outputs: Outbox = field(default_factory=Outbox)
    tenant: str = ""
    """Whose request it is: the queue shares a priority level among tenants by weight."""
    weight: int = 1
    """The tenant's weight in the queue's deficit round robin."""
    owner: str = ""
    """Whom its memory is charged to (memory.quotas), where an executor charges per batch."""
    step_bytes: list[tuple[int, int]] | None = None
    """(input bytes, output bytes) per step of a multi-step request (lifetime planning)."""
    region: StepRegion | None = None
    """A multi-step request's arena region for its steps' outputs (``memory/region.py``)."""
    decoupled: bool = False
    """Its model sends its own responses (any number), through a response channel."""
    stop: Callable[[], None] | None = None
    """While a decoupled model answers it, or while its batch runs on a backend told of
    cancellations (``BatchContext.cancels``): tells the model the request ended early."""
    facts: RequestFacts | None = None
    """What a backend may know of it (id, correlation ID, parameters, deadline, ...);
    each batch holding a step of it carries them in its context."""
    trace: Stamps | None = None
    """Its trace when the server sampled it (``server/tracing.py``): its batch's
    moments are stamped on it."""
    again: Mapping[str, Tensor] | None = None
    """Set when its model may run it again in a later batch (Triton's request
    rescheduling): the inputs that then replace its own (its START and END controls,
    false). None: it runs once."""

    @property
    def max_steps(self) -> int:
        if self.stepper is not None:
            return 1_000_000  # the stepper ends the request
        return 1 if self.stream is None else self.stream.max_steps

    @property
    def finished(self) -> bool:
        return self.state == "finished"


@dataclass(eq=False, slots=True)
class WorkItem:
    """One step of one request: what the queue orders and the batcher groups.

    ``inputs`` belong to the item (the scheduler releases them once the step has run
    or is dropped). ``rows`` is the item's extent along the batch dimension.
    ``deadline`` is on the scheduler's clock, or None for no deadline. ``delayed`` is
    set when the deadline passed under the DELAY timeout action: the item stays queued
    but yields to items that have not expired.
    """

    inputs: Mapping[str, Tensor]
    rows: int
    signature: Signature
    priority: int
    arrival: float
    deadline: float | None = None
    request: Request | None = None
    delayed: bool = False
    dispatched_at: float | None = None
    seq: int = field(default_factory=_sequence.__next__)
