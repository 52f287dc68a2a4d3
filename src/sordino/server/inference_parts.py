"""What the inference endpoints use of the runtime: its parts, named, and nothing else.

The transports' inference paths (``server/fast_infer.py``, the gRPC servicer in
``server/grpc.py``, the generate routes in ``server/http_routes.py``) take an
:class:`InferenceParts` instead of the whole :class:`~sordino.server.runtime.Runtime`,
so what a request touches is visible in one record: the service (admission, the
scheduler, the ticket), the registry (the request's route, whether the server is
stopping), the tenants (the API key), clients' shared-memory regions, the result cache,
the guardian's timings and the body limit. ``Runtime.inference`` is made once, when the
runtime is built.
"""

from __future__ import annotations

from dataclasses import dataclass

from sordino.admission.tenants import Tenants
from sordino.server.registry import ModelRegistry
from sordino.server.result_cache import ResultCache
from sordino.server.service import InferenceService
from sordino.server.shm import SystemSharedMemory
from sordino.telemetry.timings import TimingSeries

__all__ = ["InferenceParts"]


@dataclass(frozen=True, slots=True)
class InferenceParts:
    """The runtime's parts an inference request goes through (see the module)."""

    service: InferenceService
    registry: ModelRegistry
    tenants: Tenants
    shared_memory: SystemSharedMemory
    result_cache: ResultCache
    timings: TimingSeries
    max_request_size: int
    """``server.max_request_size`` (it needs a restart to change)."""
