"""From a profile's figures to suggestions: what ``sordino profile --apply`` applies.

:func:`advise` reads a model's Triton-style statistics (``/v2/models/M/stats``: time
in the queue, in staging the inputs, in the model, in handing the outputs back, rows
per batch) and its live configuration, and returns findings. A finding whose remedy
is a key that changes live carries it as ``settings`` (dotted keys for
``reconfigure``); one whose remedy is not a configuration key (send binary tensors,
add instances) says so and carries none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sordino.config.base import MAX_BATCH_SIZE

__all__ = ["Finding", "advise", "batch_sizes"]

MIN_BATCHES = 20
"""Fewer batches than this say nothing reliable: no finding."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One observation and its remedy."""

    title: str
    detail: str
    settings: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"title": self.title, "detail": self.detail, "settings": self.settings}


def _ns(stats: dict[str, Any], key: str) -> float:
    entry = stats.get(key) or {}
    return float(entry.get("ns", 0))


def batch_sizes(config: dict[str, Any], strategy: dict[str, Any]) -> tuple[int, int]:
    """``(max_batch_size, cap)`` of a model's live configuration ``config`` under the
    scheduler's ``dynamic_batching`` section ``strategy``, as the scheduler resolves them
    (``scheduling/settings.py``): a model's ``max_batch_size`` and its
    ``dynamic_batching.max_batch`` inherit the scheduler's ``max_batch`` when unset."""
    default = int(strategy.get("max_batch") or 32)
    own = config.get("max_batch_size")
    max_batch_size = default if own is None else int(own)
    batching = config.get("dynamic_batching") or {}
    enabled = batching.get("enabled")
    if not (strategy.get("enabled", True) if enabled is None else enabled):
        return max_batch_size, min(max_batch_size, 1)
    return max_batch_size, min(max_batch_size, int(batching.get("max_batch") or default))


def advise(
    model: str,
    stats: dict[str, Any],
    config: dict[str, Any],
    strategy: dict[str, Any] | None = None,
) -> list[Finding]:
    """Findings for ``model`` from one entry of ``model_stats``, its live config and the
    scheduler's ``dynamic_batching`` section ``strategy``."""
    batches = int(stats.get("execution_count", 0))
    rows = int(stats.get("inference_count", 0))
    if batches < MIN_BATCHES:
        return [
            Finding(
                "not enough traffic",
                f"{batches} batches since start-up; profile under load for findings",
            )
        ]
    inference = stats.get("inference_stats") or {}
    queue = _ns(inference, "queue")
    staging = _ns(inference, "compute_input") + _ns(inference, "compute_output")
    compute = _ns(inference, "compute_infer")
    mean_rows = rows / batches
    max_batch_size, cap = batch_sizes(config, strategy or {})
    prefix = f"models.{model}"
    findings: list[Finding] = []
    if staging > compute:
        findings.append(
            Finding(
                "most time in serialization",
                f"staging inputs and outputs took {staging / 1e6:.1f} ms against "
                f"{compute / 1e6:.1f} ms in the model: send binary tensors "
                "(KServe binary extension) or gRPC instead of JSON; no key to change",
            )
        )
    if cap > 1 and mean_rows < max(2.0, cap / 8):
        delay = (config.get("dynamic_batching") or {}).get("max_queue_delay_microseconds")
        if queue < compute:
            findings.append(
                Finding(
                    "batch never fills",
                    f"{mean_rows:.1f} rows per batch of at most {cap}, and requests wait "
                    "less than they compute: they arrive too slowly to batch; run each at "
                    "once (ultra_low_latency)",
                    {f"{prefix}.scheduler_mode": "ultra_low_latency"},
                )
            )
        elif not delay:
            findings.append(
                Finding(
                    "batch never fills",
                    f"{mean_rows:.1f} rows per batch of at most {cap} while requests queue: "
                    "wait up to 2 ms for a batch to form",
                    {f"{prefix}.dynamic_batching.max_queue_delay_microseconds": 2000},
                )
            )
    if queue > 2 * compute and mean_rows >= cap * 0.75 and 1 <= cap < MAX_BATCH_SIZE:
        # The batch cap is dynamic_batching.max_batch; max_batch_size, the rows a request
        # may carry, is raised only where the cap would pass it (never lowered).
        doubled = min(cap * 2, MAX_BATCH_SIZE)
        larger = {f"{prefix}.dynamic_batching.max_batch": doubled}
        if doubled > max_batch_size:
            larger[f"{prefix}.max_batch_size"] = doubled
        findings.append(
            Finding(
                "queue dominates with full batches",
                f"requests waited {queue / 1e6:.1f} ms in all against {compute / 1e6:.1f} ms "
                f"computing, with batches full ({mean_rows:.1f} of {cap}): allow batches of "
                f"{doubled}; more instances (instance_count) need a reload",
                larger,
            )
        )
    if not findings:
        findings.append(
            Finding("nothing stands out", f"{mean_rows:.1f} rows per batch, {batches} batches")
        )
    return findings
