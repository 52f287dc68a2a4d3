"""A request's facts for the backend: what Triton hands a Python model besides tensors.

:func:`request_facts` turns an admitted :class:`~sordino.inference.InferRequest` into
the :class:`~sordino.inference.RequestFacts` its batches carry to the model, matching
Triton 2.51 (``http_server.cc``/``grpc/infer_handler.cc`` and the Python backend's
``python_be.cc``):

- the id is the request's ``id`` ("" for none);
- the correlation ID is the sequence's (``parameters.sequence_id``, an int or a
  string; 0 without one): Triton reads it as a request field, not a parameter;
- the parameters are those the server does not consume — Triton takes
  ``sequence_id``, ``sequence_start``, ``sequence_end``, ``priority``, ``timeout``
  and ``binary_data_output`` out and passes the rest on — written as one compact JSON
  object (TritonJson writes no spaces), in the order they came; ``"{}"`` for none; the
  ``tenant`` the server resolved (from a key, or a BLS caller's) is sordino's own and
  left out (the model has it as ``_sordino_tenant``);
- the flags are the sequence's start (1) and end (2), as the correlation ID is;
- the timeout is the ``timeout`` parameter as sent, in microseconds (0 for none);
- the requested outputs are the names the client asked for (empty: every output).

Beside those, sordino's own: the priority level admission gave it, its deadline as a
``time.time()`` value, and its tenant when tenants are configured.
"""

from __future__ import annotations

import json
import time

from sordino.inference import InferRequest, RequestFacts

__all__ = ["CONSUMED_PARAMETERS", "request_facts"]

CONSUMED_PARAMETERS = frozenset(
    ("sequence_id", "sequence_start", "sequence_end", "priority", "timeout", "binary_data_output")
)
"""Request parameters the server takes for itself and a model never sees (Triton's)."""


def request_facts(
    request: InferRequest, priority: int, timeout_s: float | None, tenant: str | None
) -> RequestFacts:
    """The facts of ``request`` as admitted: at ``priority``, ``timeout_s`` from now."""
    given = request.parameters
    parameters = "{}"
    if given:
        kept = {k: v for k, v in given.items() if k not in CONSUMED_PARAMETERS}
        if request.tenant is not None:  # the server's own (authenticated, a BLS caller's)
            kept.pop("tenant", None)
        if kept:
            parameters = json.dumps(kept, separators=(",", ":"), default=str)
    wanted = request.outputs
    timeout = given.get("timeout", 0) if given else 0
    return RequestFacts(
        id=request.id or "",
        correlation_id=request.correlation_id,
        parameters=parameters,
        outputs=tuple(o.name for o in wanted) if wanted else (),
        flags=request.flags,
        timeout_us=timeout if isinstance(timeout, int) and not isinstance(timeout, bool) else 0,
        priority=priority,
        deadline=None if not timeout_s else time.time() + timeout_s,
        tenant=tenant,
    )
