"""What the memory side reports: the arena, the memory manager (tiers, owners, forecasts,
resizing, framework memory, step plans, compaction) and the Ray executor's node pools.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ArenaStatistics",
    "CompactionStatistics",
    "CompactionStep",
    "DefragReport",
    "MemoryForecast",
    "MemoryStatistics",
    "NodeMemoryStatistics",
    "OwnerStatistics",
    "PoolStatistics",
    "ResizeReport",
    "StepPlanStatistics",
    "TierStatistics",
    "WorkerMemory",
]


@dataclass(frozen=True, slots=True)
class ArenaStatistics:
    """A snapshot of the arena: bytes reserved / in use / at peak, and fragmentation."""

    name: str
    reserved_bytes: int
    in_use_bytes: int
    peak_bytes: int
    free_bytes: int
    largest_free: int
    fragmentation: float
    used_blocks: int
    acquired: int
    failed: int
    waiting: int


@dataclass(frozen=True, slots=True)
class TierStatistics:
    """One size tier and lifetime class of the ``fragmentation_aware`` allocator."""

    tier: str
    """``small``, ``medium`` or ``large``."""
    lifetime: str
    """``short`` (a batch's buffers) or ``long`` (carried state)."""
    reserved_bytes: int
    in_use_bytes: int
    peak_bytes: int
    largest_free: int
    fragmentation: float
    chunks: int


@dataclass(frozen=True, slots=True)
class DefragReport:
    """One defragmentation run: what moved and what it cost."""

    bytes_moved: int
    blocks_moved: int
    fragmentation_before: float
    fragmentation_after: float
    pause_s: float
    """The longest single pause of the event loop (no batch started, no request was
    answered meanwhile): a run moves blocks in bounded steps and lets the event loop
    run between them, so this is its longest step, not its whole duration."""
    reason: str
    """``interval``, ``threshold``, ``manual``, ``guardian`` or what the caller said."""
    movable_blocks: int = 0
    """Blocks that could move (owned only by queued work and carried state) at the start."""
    pinned_blocks: int = 0
    """Blocks left where they are (in use by a running batch or a response) at the start."""
    duration_s: float = 0.0
    """From the run's start to its end, the steps and the time between them."""
    steps: int = 0
    """How many steps (pauses) the run took."""


@dataclass(frozen=True, slots=True)
class OwnerStatistics:
    """Bytes accounted to one owner (a tenant, or ``default``) and its quota."""

    owner: str
    in_use_bytes: int
    peak_bytes: int
    quota_bytes: int | None
    waits: int
    """Requests that waited for the owner's quota."""
    rejections: int
    """Requests refused (429) because the quota stayed full."""


@dataclass(frozen=True, slots=True)
class MemoryForecast:
    """What one model's requests cost in the arena, learned, and what the forecast implies.

    ``predicted_peak_bytes`` is Little's law on the forecast: the peak requests per
    second of the next hour x bytes per request x seconds per request (None without
    a forecast). With ``memory.pool_size: auto`` the arena is resized from the sum
    over models (see :class:`PoolStatistics`).
    """

    model: str
    buckets: tuple[tuple[int, int, int], ...]
    """(rows up to, requests seen, bytes per request) per shape bucket (powers of two)."""
    bytes_per_request: float
    seconds_per_request: float
    forecast_peak_qps: float | None
    predicted_peak_bytes: float | None


@dataclass(frozen=True, slots=True)
class MemoryStatistics:
    """The memory manager: the arena, its tiers, owners, overflow and defragmentation."""

    strategy: str
    arena: ArenaStatistics | None
    tiers: tuple[TierStatistics, ...]
    owners: tuple[OwnerStatistics, ...]
    defrag_runs: int
    defrag_bytes_moved: int
    defrag_pause_s: float
    """Sum of every run's pause."""
    last_defrag: DefragReport | None
    overflow_shrinks: int
    """Batches made smaller so that they fit the arena."""
    overflow_waits: int
    """Batches that waited for arena space."""
    overflow_rejections: int
    """Requests answered 503 because the arena stayed full."""
    oversized_rejections: int
    """Requests refused because they alone are larger than the arena."""
    forecasts: tuple[MemoryForecast, ...] = ()
    """Per model: learned bytes per request and the peak the forecast implies."""
    pool: PoolStatistics | None = None
    """The arena's size, pool_size auto's target and the resizes."""
    workers: tuple[WorkerMemory, ...] = ()
    """Framework memory per worker process."""
    plans: tuple[StepPlanStatistics, ...] = ()
    """Tensor lifetime planning per multi-step model."""
    nodes: tuple[NodeMemoryStatistics, ...] = ()
    """Per Ray node, its memory pool (executor.kind: ray)."""
    compaction: CompactionStatistics | None = None
    """Incremental compaction at batch boundaries (``memory.compact_step``)."""
    pools: tuple[OwnerStatistics, ...] = ()
    """Per model with a node pool (``nodes[].runtime.memory_pool``): its bytes in flight."""


@dataclass(frozen=True, slots=True)
class ResizeReport:
    """One replacement of the arena's segment by a larger or smaller one."""

    bytes_before: int
    bytes_after: int
    bytes_copied: int
    """Live bytes copied into the new segment (parked work, carried state)."""
    blocks_copied: int
    pause_s: float
    """How long the event loop was held (no batch started meanwhile)."""
    reason: str
    """``grow``/``shrink`` (pool_size auto), ``manual`` or what the caller said."""


@dataclass(frozen=True, slots=True)
class PoolStatistics:
    """The arena's size and what pool_size auto aims for."""

    auto: bool
    capacity_bytes: int
    min_bytes: int | None
    max_bytes: int | None
    target_bytes: int | None
    """What pool_size auto would size the arena to now (None: not auto, or nothing
    learned yet)."""
    predicted_peak_bytes: float | None
    """The sum over models of the forecast's implied peak (Little's law)."""
    observed_peak_bytes: int
    """The arena's real peak in use since its segment was created."""
    resizes: int
    deferred: int
    """Resizes put off because the arena was not quiet (a batch ran)."""
    last_resize: ResizeReport | None


@dataclass(frozen=True, slots=True)
class WorkerMemory:
    """One worker process's framework memory, as far as it can be measured.

    ONNX Runtime does not expose the size of its CPU arena, so the process's resident
    set (psutil) is the worker's framework memory: model weights, the arena, buffers.
    ``gpu`` is "absent" without the CUDA execution provider (never a made-up figure).
    """

    model: str
    version: str
    instance: int
    pid: int | None
    rss_bytes: int | None
    cpu_arena: str
    """The CPU arena's settings: "on, kSameAsRequested, shrink after N rows", "off"."""
    gpu: str
    """"absent" (no CUDA execution provider) or the CUDA arena's settings."""
    gpu_bytes: int | None = None
    """GPU memory the process holds as NVML reports it (the CUDA arena included);
    None when the CUDA provider is absent or NVML cannot say."""


@dataclass(frozen=True, slots=True)
class StepPlanStatistics:
    """Tensor lifetime planning of one multi-step model: planned vs naive peak bytes."""

    model: str
    requests: int
    steps: int
    """Steps of the last planned request."""
    planned_peak_bytes: int
    """One region laid out greedy-by-size for a request's steps (the last request)."""
    naive_bytes: int
    """Every step's tensors in their own block, none reused (the last request)."""
    max_planned_peak_bytes: int
    """The largest planned region of any request so far."""
    region_bytes: int = 0
    """The last request's output region as reserved: the plan of its steps' outputs."""
    region_peak_bytes: int = 0
    """The most bytes of that region its steps really used at once."""
    region_fallbacks: int = 0
    """Output blocks of that request that did not fit its region (taken from the arena)."""
    regions: int = 0
    """Requests that ran in a region of their own so far."""


@dataclass(frozen=True, slots=True)
class NodeMemoryStatistics:
    """One Ray node's memory pool (``executor.kind: ray``): its arena, owners and quotas."""

    node: str
    """The Ray node id (what ``sordino_node_*{node}`` and the workers' ``node`` say)."""
    address: str
    """The node's IP address."""
    arena: ArenaStatistics
    """The node pool's segment and its allocator's figures (``memory.strategy``)."""
    owners: tuple[OwnerStatistics, ...]
    """Bytes in flight per owner on this node, against the per-node quotas."""
    batches: int
    """Batches placed in the pool."""
    overflow_waits: int
    """Batches that waited for space in the pool."""
    overflow_rejections: int
    """Batches answered 503 because the pool stayed full."""


@dataclass(frozen=True, slots=True)
class CompactionStep:
    """One step of incremental compaction at a batch boundary: what moved, the pause."""

    bytes_moved: int
    blocks_moved: int
    pause_s: float


@dataclass(frozen=True, slots=True)
class CompactionStatistics:
    """Incremental compaction so far: steps taken, those that moved bytes, the pauses."""

    budget_bytes: int
    """``memory.compact_step``: the most bytes one step moves."""
    steps: int
    steps_moving: int
    bytes_moved: int
    blocks_moved: int
    pause_s: float
    """Sum of every step's pause."""
    max_pause_s: float
