"""The batch context: what the executor is told about a batch besides its tensors.

The scheduler builds one :class:`BatchContext` per batch and hands it to
``Executor.run(model, parts, context)``; the executor passes it down, explicitly, to
what needs it — staging (the step region), chaos faults (the tenants), a Ray node's
memory pool (the owners), a worker process and its backend (each request's facts). No
batch fact travels in a context variable, so what a layer reads is in its signature.

``owners`` and ``requests`` are in the order of the batch's parts (one entry each);
either may be empty when the caller knows nothing of the requests (warm-up and
profiling batches, tests), which every reader takes as "no facts".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sordino.inference import RequestFacts
from sordino.memory.region import StepRegion

__all__ = ["NO_CONTEXT", "BatchContext", "Cancels", "RequestFacts"]


class Cancels:
    """The requests of a running batch whose clients went away; used on the event loop.

    The scheduler calls :meth:`cancel` with a request's index in the batch when the
    request ends before its batch does (its client cancelled or disconnected). The
    instance running the batch binds a listener that tells the model
    (``is_cancelled()`` turns true: a worker process gets a ``Cancel`` frame, a thread
    instance a flag its thread reads); one bound later (the batch retried elsewhere)
    hears of the cancellations made before it.
    """

    __slots__ = ("_listener", "indices")

    def __init__(self) -> None:
        self.indices: set[int] = set()
        self._listener: Callable[[int], None] | None = None

    def bind(self, listener: Callable[[int], None] | None) -> None:
        """Tell ``listener`` of each cancellation, those made already first (None: nobody)."""
        self._listener = listener
        if listener is not None:
            for index in sorted(self.indices):
                listener(index)

    def cancel(self, index: int) -> None:
        """Request ``index`` of the batch ended early: tell whoever runs the batch (once)."""
        if index in self.indices:
            return
        self.indices.add(index)
        if self._listener is not None:
            self._listener(index)


@dataclass(frozen=True, slots=True)
class BatchContext:
    """Facts about one batch, one entry per part where they are per request.

    ``owners``: whom each part's memory is charged to (the request's tenant as memory
    quotas name it, ``default`` for none), read by executors that account memory per
    batch (the Ray executor's node pools). ``tenants``: the tenants whose requests are
    in the batch (empty without tenants); a chaos fault scoped to a tenant hits only
    batches holding its requests. ``region``: for a batch that is one step of one
    multi-step request, that request's arena region, where staging places the step's
    outputs. ``requests``: each request's :class:`RequestFacts`, which a backend that
    runs a batch as its requests (Triton's Python backend) hands to the model.
    ``cancels``: where the scheduler says which of them were cancelled while the batch
    runs (for such a backend; None: the model is not told).
    """

    owners: tuple[str, ...] = ()
    tenants: frozenset[str] = frozenset()
    region: StepRegion | None = None
    requests: tuple[RequestFacts, ...] = ()
    cancels: Cancels | None = None


NO_CONTEXT = BatchContext()
"""The context of a batch no request stands behind (warm-up, profiling, tests)."""
