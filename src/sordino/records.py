"""The shared records: what the parts of the runtime report, and who listens.

Every stateful part has ``statistics()`` returning a frozen record; telemetry exports
these, the guardian will judge by them, and the monitor and dashboard show them. The
records live here, at the bottom of the import graph (beside ``inference.py``), so
that telemetry depends on records and events only, never on the scheduling,
execution or memory layers that produce them (``tests/test_layers.py`` enforces
this). A part imports its own record from here; nothing here imports a layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from sordino.inference import ModelKey

__all__ = [
    "ArenaStatistics",
    "BatchDone",
    "BreakerState",
    "BreakerStatistics",
    "ConnectionStatistics",
    "ControllerStatistics",
    "DeviceStatistics",
    "ExecutionStatistics",
    "InstanceState",
    "Outcome",
    "OutlierStatistics",
    "QueueSettings",
    "QueueStatistics",
    "RequestDone",
    "SchedulerObserver",
    "SchedulerStatistics",
    "SwitchStatistics",
    "WorkerStatistics",
]

Outcome = Literal["success", "failure", "cancelled"]
"""How an accepted request ended."""

InstanceState = Literal["starting", "ready", "restarting", "stopped"]
BreakerState = Literal["closed", "open", "half_open"]


# -- scheduling ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueueSettings:
    """Queue policy of one model (Triton's ``dynamic_batching`` queue fields)."""

    priority_levels: int = 3
    default_priority: int = 2
    max_queue_size: int = 1024
    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_s: float = 0.0
    allow_timeout_override: bool = True
    shed_late: bool = True
    """Refuse at admission a request the work ahead would make miss its deadline; false
    (``scheduler.priority: frame_sync``) queues it and lets it run late."""


@dataclass(frozen=True, slots=True)
class QueueStatistics:
    """A snapshot of one model's queue."""

    depth: int
    rows: int
    max_size: int
    depth_by_priority: tuple[int, ...]
    oldest_arrival: float | None


@dataclass(frozen=True, slots=True)
class ControllerStatistics:
    """What a mode controller is doing now."""

    mode: str
    effective_mode: str
    max_batch: int
    max_delay_s: float
    p99_s: float | None
    adjustments: int


@dataclass(frozen=True, slots=True)
class SchedulerStatistics:
    """A snapshot of one model's scheduler.

    ``accepted == succeeded + failed + cancelled + in_flight`` always holds: every
    accepted request ends in exactly one outcome. ``isolated_batches`` counts batches
    the model raised on that were re-run one request at a time.
    """

    model: str
    version: str
    accepted: int
    succeeded: int
    failed: int
    cancelled: int
    in_flight: int
    rejected: int
    timed_out: int
    batches: int
    batched_rows: int
    running_batches: int
    isolated_batches: int
    queue: QueueStatistics
    controller: ControllerStatistics


@dataclass(frozen=True, slots=True)
class RequestDone:
    """An accepted request ended: how, and where its time went (over all its steps)."""

    model: ModelKey
    outcome: Outcome
    reason: str
    priority: int
    queue_s: float
    compute_s: float
    total_s: float
    late_s: float | None = None
    """For a request with a deadline: how long after it the request ended (0 if on time)."""
    step_bytes: tuple[tuple[int, int], ...] = ()
    """A multi-step request's (input bytes, output bytes) per step; empty for one step."""
    region: tuple[int, int, int] | tuple[()] = ()
    """A multi-step request's output region: (planned bytes, the most bytes of it in
    use at once, output blocks that did not fit it); empty without a region."""
    request_id: str | None = None
    """The client's request id (KServe ``id``), None when it sent none."""


@dataclass(frozen=True, slots=True)
class BatchDone:
    """A batch ran: its rows and requests, and the time of each phase."""

    model: ModelKey
    rows: int
    requests: int
    input_s: float
    infer_s: float
    output_s: float
    ok: bool


class SchedulerObserver(Protocol):
    """Receives what happens to requests and batches (telemetry implements this)."""

    def request_done(self, done: RequestDone) -> None: ...

    def batch_done(self, done: BatchDone) -> None: ...

    def queue_changed(self, model: ModelKey, depth: int) -> None: ...


# -- execution and memory ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class WorkerStatistics:
    """One model instance: where it runs, whether it serves, how often it was replaced."""

    model: str
    version: str
    index: int
    tier: str
    device: str
    isolation: str
    state: InstanceState
    busy: bool
    pid: int | None
    restarts: int
    batches: int
    failures: int
    last_cause: str
    profiling: bool
    node: str = ""
    """The Ray node the instance's actor runs on (executor.kind: ray); "" for this machine."""
    busy_s: float = 0.0
    """Seconds this instance has spent running batches since it was placed (its busy
    share over a window is the growth of this figure over the window's length)."""
    hop_bytes: int = 0
    """Bytes of tensors that crossed the worker hop: each batch's inputs the worker
    process read from the arena and the outputs it wrote back (0 in the server's process)."""


@dataclass(frozen=True, slots=True)
class BreakerStatistics:
    """A snapshot of one breaker and the window it judges by."""

    name: str
    state: BreakerState
    window_requests: int
    window_failures: int
    error_rate: float
    opened: int
    closed: int
    probes_in_flight: int
    probe_successes: int
    since: float


@dataclass(frozen=True, slots=True)
class DeviceStatistics:
    """A device: whether this machine has it, and its breaker (chains only)."""

    name: str
    available: bool
    reason: str
    breaker: BreakerStatistics | None


@dataclass(frozen=True, slots=True)
class SwitchStatistics:
    """Batches of one model moved from one device to the next after a failure.

    ``total_s``/``max_s``/``last_s``: time from the failure on ``from_device`` to the
    result from ``to_device``; ``dispatch_total_s``: from the failure to the batch
    being handed to the next device (the switch itself, without the fallback's compute).
    """

    model: str
    from_device: str
    to_device: str
    count: int
    total_s: float
    max_s: float
    last_s: float
    dispatch_total_s: float


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
class OutlierStatistics:
    """One instance as outlier ejection sees it (``execution/outliers.py``).

    ``consecutive_failures``: batches failed by the instance itself (another instance
    ran them), in a row; ``ejections``: times it was ejected; ``ejected_until``: the
    clock time its ejection ends, None while it is in placement.
    """

    model: str
    version: str
    index: int
    consecutive_failures: int
    ejections: int
    ejected_until: float | None
    last_cause: str


@dataclass(frozen=True, slots=True)
class ExecutionStatistics:
    """Everything the executor knows about its workers, devices, switches and arena."""

    workers: tuple[WorkerStatistics, ...]
    devices: tuple[DeviceStatistics, ...]
    switches: tuple[SwitchStatistics, ...]
    retries: int
    arena: ArenaStatistics | None
    faults_active: int
    faults_applied: int
    outliers: tuple[OutlierStatistics, ...] = ()
    """Instances that failed a batch of their own or were ejected (none before that)."""
    arena_bytes: int = 0
    """Bytes staging copied into the shared-memory arena (batch inputs not already there)."""


# -- transports ------------------------------------------------------------------------


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


# -- the memory manager ----------------------------------------------------------------

__all__ += [
    "DefragReport",
    "MemoryForecast",
    "MemoryStatistics",
    "OwnerStatistics",
    "TierStatistics",
]


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


# -- the guardian ----------------------------------------------------------------------


__all__ += ["GuardianStatistics", "TriggerStatistics"]


@dataclass(frozen=True, slots=True)
class TriggerStatistics:
    """One guardian trigger now: its metric's value against its threshold, its state."""

    name: str
    metric: str
    model: str | None
    threshold: str
    window_s: float
    value: float | None
    value_text: str
    holds: bool
    actions: tuple[str, ...]
    next_action: str
    cooldown_left_s: float
    active: tuple[str, ...]
    """Actions applied and not yet verified, or holding a change until the condition
    has stayed clear for the cooldown."""
    fired: int


@dataclass(frozen=True, slots=True)
class GuardianStatistics:
    """The guardian: its triggers, the hourly action budget, the records it left."""

    enabled: bool
    interval_s: float
    triggers: tuple[TriggerStatistics, ...]
    budget_per_hour: int
    actions_last_hour: int
    records: int
    alert_channels: tuple[str, ...]
    alerts_sent: int
    alerts_failed: int
    """Failed delivery attempts (each retry counts) and alerts dropped from a full queue."""


# -- tenants -----------------------------------------------------------------------------

__all__ += ["TenantStatistics"]


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


# -- the memory manager: resizing, framework memory, step plans --------------------------

__all__ += ["PoolStatistics", "ResizeReport", "StepPlanStatistics", "WorkerMemory"]


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


# -- node pools of the Ray executor ----------------------------------------------------


__all__ += ["NodeMemoryStatistics"]


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


# -- incremental compaction (issue 10) -------------------------------------------------


__all__ += ["CompactionStatistics", "CompactionStep"]


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


# -- pipelines (issue 14) ----------------------------------------------------------------


__all__ += ["PipelineStatistics"]


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
