"""From configuration to a model's batch policy, queue settings and mode.

The rules, in one place:

- The model's ``max_batch_size`` bounds the rows one request may carry and the rows
  of one batch; when unset it defaults to the scheduler's ``max_batch``. A model
  whose tensors have no variable leading dimension never batches (0).
- The batch cap is ``min(max_batch_size, scheduler max_batch)``.
- The wait is the model's ``max_queue_delay_microseconds`` if set, else the
  scheduler's ``timeout_ms``; ``min_batch`` and preferred sizes likewise.
- ``dynamic_batching.enabled: false`` turns batching off (cap 1, no wait): the
  scheduler's for every model, or a model's own (Triton's rule for a ``config.pbtxt``
  without ``dynamic_batching``: its requests are never joined).
- The denoiser of a Stable Diffusion export runs ``ultra_low_latency`` unless the
  model's ``scheduler_mode`` or the server's ``scheduler.mode`` is set: its batch is
  the steps of the generations that queued while the previous call ran, and a step
  alone can take longer than the p99 target adaptive tunes toward (a step is not a
  request), which would cut that batch (issue 28's benchmark: 6.5 rows a call at 8
  users under adaptive, 10.9 of 16 under ultra_low_latency).
- A node's runtime policy (``config/nodes.py``) comes on top: its ``scheduler`` is the
  model's mode (``dynamic_batching``: batching on, even where the server-wide strategy
  is off), and a top-level node's ``priority`` and ``timeout`` are the level and the
  deadline of a request that names none.
- ``scheduler.priority: frame_sync``: a request's default deadline is one frame
  (unless the model sets one), a late request is kept (DELAY, behind those on time)
  and runs late instead of being refused at admission, so its lateness is measured
  (``frame_delay``) and the guardian can act on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sordino.config import ModelConfig, SchedulerConfig
from sordino.config.models import DynamicBatchingConfig
from sordino.config.nodes import NodePolicy
from sordino.records import LevelQueue, QueueSettings
from sordino.scheduling.batcher import BatchPolicy
from sordino.scheduling.modes import Mode, conservative_policy, conservative_queue_size

__all__ = ["ModelScheduling", "scheduling_for"]


@dataclass(frozen=True, slots=True)
class ModelScheduling:
    """Everything the scheduler of one model needs from configuration."""

    mode: Mode
    max_batch_size: int
    policy: BatchPolicy
    queue: QueueSettings
    slo_s: float


def scheduling_for(
    scheduler: SchedulerConfig,
    model: ModelConfig,
    *,
    batched: bool,
    instances: int = 1,
    node: NodePolicy | None = None,
) -> ModelScheduling:
    """Resolve the effective scheduling of ``model`` under ``scheduler`` (and ``node``,
    the policy of the node that runs it, if any)."""
    strategy = scheduler.dynamic_batching
    batching = model.dynamic_batching
    mode: Mode = model.scheduler_mode or scheduler.mode
    export = model.iterative is not None and model.iterative.export is not None
    if export and model.scheduler_mode is None and "mode" not in scheduler.model_fields_set:
        mode = "ultra_low_latency"
    if node is not None and node.scheduler is not None:
        if node.scheduler == "dynamic_batching":
            strategy = strategy.model_copy(update={"enabled": True})
        else:
            mode = node.scheduler  # type: ignore[assignment]  # a SchedulerMode (checked)
    if not batched:
        max_batch_size = 0
    elif model.max_batch_size is not None:
        max_batch_size = model.max_batch_size
    else:
        max_batch_size = strategy.max_batch
    enabled = strategy.enabled if batching.enabled is None else batching.enabled
    if node is not None and node.scheduler == "dynamic_batching":
        enabled = True
    cap = min(max_batch_size, batching.max_batch or strategy.max_batch) if enabled else 1
    cap = max(cap, 1)
    if batching.max_queue_delay_microseconds is not None:
        delay_s = batching.max_queue_delay_microseconds / 1e6
    else:
        delay_s = strategy.timeout_ms / 1000
    min_batch = batching.min_batch_size or strategy.min_batch
    preferred = batching.preferred_batch_size or strategy.preferred_batch
    slots = _slot_utilization(model, cap)
    if slots is not None:  # Triton's direct strategy: wait for that many ready requests
        delay_s, min_batch, preferred = slots
    policy = BatchPolicy(
        max_batch=cap,
        min_batch=min(min_batch, cap),
        max_delay_s=delay_s if cap > 1 else 0.0,
        preferred=tuple(sorted(p for p in preferred if p <= cap)),
    )
    queue_policy = batching.default_queue_policy
    max_queue = queue_policy.max_queue_size
    if mode == "conservative":
        max_queue = conservative_queue_size(
            max_queue, conservative_policy(policy).max_batch, instances
        )
    default_timeout_s = queue_policy.default_timeout_microseconds / 1e6
    default_priority = batching.default_priority_level
    if node is not None and node.timeout is not None:
        default_timeout_s = node.timeout
    if node is not None and node.priority is not None:
        default_priority = _level(node.priority, batching.priority_levels, default_priority)
    frame_sync = scheduler.priority == "frame_sync"
    queue = QueueSettings(
        priority_levels=batching.priority_levels,
        default_priority=default_priority,
        max_queue_size=max_queue,
        timeout_action="DELAY" if frame_sync else queue_policy.timeout_action,
        default_timeout_s=(default_timeout_s or scheduler.frame_s)
        if frame_sync
        else default_timeout_s,
        allow_timeout_override=queue_policy.allow_timeout_override,
        shed_late=not frame_sync,
        levels=_levels(batching),
        preserve_ordering=batching.preserve_ordering,
    )
    return ModelScheduling(mode, max_batch_size, policy, queue, scheduler.slo_p99_ms / 1000)


def _slot_utilization(model: ModelConfig, cap: int) -> tuple[float, int, tuple[int, ...]] | None:
    """A sequence model's ``direct`` wait as the batcher's (delay, minimum rows, preferred
    sizes), when its ``max_queue_delay_microseconds`` and ``minimum_slot_utilization``
    are both above 0: a batch runs once that fraction of ``cap`` is ready (any size from
    it on), or the delay passed. None otherwise (its requests wait as configured)."""
    sequences = model.sequence_batching
    direct = sequences.direct if sequences is not None else None
    if direct is None or not direct.max_queue_delay_microseconds:
        return None
    if not direct.minimum_slot_utilization:
        return None
    ready = max(1, math.ceil(direct.minimum_slot_utilization * cap - 1e-9))
    return direct.max_queue_delay_microseconds / 1e6, ready, tuple(range(ready, cap + 1))


def _levels(batching: DynamicBatchingConfig) -> tuple[LevelQueue | None, ...]:
    """Each level's own queue policy (``priority_queue_policy``), by level; () for none."""
    policies = batching.priority_queue_policy
    if not policies:
        return ()
    return tuple(
        None
        if (policy := policies.get(level)) is None
        else LevelQueue(
            timeout_action=policy.timeout_action,
            default_timeout_s=policy.default_timeout_microseconds / 1e6,
            allow_timeout_override=policy.allow_timeout_override,
            max_queue_size=policy.max_queue_size,
        )
        for level in range(1, batching.priority_levels + 1)
    )


def _level(priority: int | str, levels: int, default: int) -> int:
    """A node's priority as a level of the model's queue (1 is the highest)."""
    if priority == "high":
        return 1
    if priority == "low":
        return levels
    if priority == "normal":
        return default
    return int(priority)  # within the levels: checked at load (server/loader.py)
