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

__all__ = ["Finding", "advise"]

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


def advise(model: str, stats: dict[str, Any], config: dict[str, Any]) -> list[Finding]:
    """Findings for ``model`` from one entry of ``model_stats`` and its live config."""
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
    cap = int(config.get("max_batch_size") or 0)
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
    if queue > 2 * compute and mean_rows >= cap * 0.75 and cap >= 1:
        findings.append(
            Finding(
                "queue dominates with full batches",
                f"requests waited {queue / 1e6:.1f} ms in all against {compute / 1e6:.1f} ms "
                f"computing, with batches full ({mean_rows:.1f} of {cap}): allow larger "
                "batches; more instances (instance_count) need a reload",
                {f"{prefix}.max_batch_size": cap * 2},
            )
        )
    if not findings:
        findings.append(
            Finding("nothing stands out", f"{mean_rows:.1f} rows per batch, {batches} batches")
        )
    return findings
