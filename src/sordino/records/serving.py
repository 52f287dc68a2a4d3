"""What the server's own parts report: the HTTP listener's connections, each tenant at
admission, how a pipeline's tensors travelled between its nodes, and the response cache.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CacheFigures",
    "ConnectionStatistics",
    "PipelineStatistics",
    "TenantStatistics",
]


@dataclass(frozen=True, slots=True)
class CacheFigures:
    """The response cache as a whole (Triton's ``nv_cache_*`` gauges)."""

    size: int
    used: int
    entries: int
    lookups: int
    hits: int
    misses: int
    evictions: int
    lookup_s: float
    insertion_s: float


@dataclass(frozen=True, slots=True)
class ConnectionStatistics:
    """The HTTP listener's connections: open now, the limits, refusals and timeouts."""

    open: int
    clients: int
    """Distinct client addresses with a connection open."""
    max_connections: int
    max_connections_per_client: int
    refused_total: int
    """Connections refused because the server held ``max_connections``."""
    refused_per_client: int
    """Connections refused because their address held ``max_connections_per_client``."""
    header_timeouts: int
    """Connections closed for sending no complete request headers in time."""
    body_timeouts: int
    """Connections closed for sending a request body too slowly."""


@dataclass(frozen=True, slots=True)
class TenantStatistics:
    """One configured tenant's live figures (admission/tenants.py)."""

    tenant: str
    weight: int
    in_flight: int
    admitted: int
    refused_rate: int
    refused_concurrency: int
    refused_breaker: int
    breaker_open: bool
    breaker_trips: int


@dataclass(frozen=True, slots=True)
class PipelineStatistics:
    """How one pipeline's tensors travelled between its nodes, and its lifetime plan."""

    pipeline: str
    batches: int
    handed_over: int
    """Node inputs given to the node as the arena block they lay in (no copy here)."""
    entered: int
    """Pipeline inputs written into the arena by the pipeline (a batch of several
    requests, or an input read by several nodes): the one copy a request's input gets."""
    recopied: int
    """Node inputs that lay in the arena but were written again by the node model's
    staging, because its batch joined them with other work (counted per node model:
    shared with any other pipeline that uses the model)."""
    planned_peak_bytes: int
    """The last batch's tensors laid out by lifetime (released after their last reader)."""
    naive_bytes: int
    """The last batch's tensors each in its own block, none reused."""
