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

from dataclasses import dataclass

from sordino.inference import RequestFacts
from sordino.memory.region import StepRegion

__all__ = ["NO_CONTEXT", "BatchContext", "RequestFacts"]


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
    """

    owners: tuple[str, ...] = ()
    tenants: frozenset[str] = frozenset()
    region: StepRegion | None = None
    requests: tuple[RequestFacts, ...] = ()


NO_CONTEXT = BatchContext()
"""The context of a batch no request stands behind (warm-up, profiling, tests)."""
