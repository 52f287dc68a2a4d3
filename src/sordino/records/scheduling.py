"""What the scheduler reports: the queue policy, queue and batching figures, and the
observer that hears of every request and batch (telemetry implements it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from sordino.inference import ModelKey

__all__ = [
    "BatchDone",
    "ControllerStatistics",
    "LevelQueue",
    "Outcome",
    "QueueSettings",
    "QueueStatistics",
    "RequestDone",
    "SchedulerObserver",
    "SchedulerStatistics",
]


Outcome = Literal["success", "failure", "cancelled"]
"""How an accepted request ended."""


@dataclass(frozen=True, slots=True)
class LevelQueue:
    """One priority level's own queue policy (Triton's ``priority_queue_policy``)."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    default_timeout_s: float = 0.0
    allow_timeout_override: bool = True
    max_queue_size: int = 0
    """Most items of this level queued; 0: no limit of its own."""


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
    levels: tuple[LevelQueue | None, ...] = ()
    """Each level's own policy (index: level - 1), where it has one; the fields above
    are every other level's (and ``max_queue_size`` bounds all of them together)."""
    preserve_ordering: bool = False
    """Answer each batch's requests only once every batch started before it was answered
    (Triton's ``preserve_ordering``): with several instances, a short batch waits for a
    longer one started earlier."""

    def timeout_rule(self, priority: int) -> tuple[float, bool]:
        """The default deadline (seconds, 0: none) and whether a request may set its
        own, for a request at ``priority``."""
        level = self.levels[priority - 1] if 0 < priority <= len(self.levels) else None
        if level is None:
            return self.default_timeout_s, self.allow_timeout_override
        return level.default_timeout_s, level.allow_timeout_override

    def rejects_late(self, priority: int) -> bool:
        """Whether a request at ``priority`` is failed at its deadline (REJECT)."""
        level = self.levels[priority - 1] if 0 < priority <= len(self.levels) else None
        return (self.timeout_action if level is None else level.timeout_action) == "REJECT"


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
