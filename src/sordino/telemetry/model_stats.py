"""Per-model statistics in the shape of Triton's statistics extension.

``GET /v2/models/{m}/stats`` returns these: cumulative counts and nanoseconds for
successes, failures, queueing and the three compute phases, and the same per batch
size. Each request in a batch is charged that batch's compute time, as Triton does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sordino.inference import ModelKey
from sordino.records import BatchDone, RequestDone

__all__ = ["FAILURE_REASONS", "ModelStats", "triton_reason"]

FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
"""Triton's reasons for a failed request (``nv_inference_request_failure{reason}``)."""

_REJECTED = frozenset(
    {"queue_full", "shed", "queue_timeout", "rate_limited", "out_of_memory", "unavailable"}
)
"""sordino's reasons for a request its scheduler refused or let expire in its queue."""
_BACKEND = frozenset({"inference_failed"})
"""sordino's reasons for a request the model failed (raised, died, returned no answer)."""
_ANSWERED = frozenset({"model_response_error", "model_rejected"})
"""A model's own error response (a Python model's ``TritonError``): Triton counts the
request a success, the model having run; sordino's own figures count it a failure."""


def triton_reason(outcome: str, reason: str) -> str:
    """The Triton failure reason of a request that ended ``outcome`` for ``reason``;
    ``SUCCESS`` for one Triton counts successful."""
    if outcome == "success" or reason in _ANSWERED:
        return "SUCCESS"
    if outcome == "cancelled" or reason == "cancelled":
        return "CANCELED"
    if reason in _REJECTED:
        return "REJECTED"
    if reason in _BACKEND:
        return "BACKEND"
    return "OTHER"


@dataclass
class _Duration:
    count: int = 0
    ns: int = 0

    def add(self, seconds: float, count: int = 1) -> None:
        self.count += count
        self.ns += int(seconds * 1e9) * count

    def as_dict(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass
class _BatchStats:
    compute_input: _Duration = field(default_factory=_Duration)
    compute_infer: _Duration = field(default_factory=_Duration)
    compute_output: _Duration = field(default_factory=_Duration)


class ModelStats:
    """Triton-style statistics for every model version; also a :class:`SchedulerObserver`."""

    def __init__(self) -> None:
        self._models: dict[ModelKey, dict[str, Any]] = {}

    def _entry(self, model: ModelKey) -> dict[str, Any]:
        entry = self._models.get(model)
        if entry is None:
            entry = self._models[model] = {
                "last_inference": 0,
                "inference_count": 0,
                "execution_count": 0,
                "success": _Duration(),
                "fail": _Duration(),
                "queue": _Duration(),
                "compute_input": _Duration(),
                "compute_infer": _Duration(),
                "compute_output": _Duration(),
                "cache_hit": _Duration(),
                "cache_miss": _Duration(),
                "batches": {},
                "failures": dict.fromkeys(("SUCCESS", *FAILURE_REASONS), 0),
            }
        return entry

    def forget(self, model: ModelKey) -> None:
        """Drop the statistics of an unloaded model version."""
        self._models.pop(model, None)

    def request_done(self, done: RequestDone) -> None:
        entry = self._entry(done.model)
        if done.outcome == "success":
            entry["success"].add(done.total_s)
            entry["queue"].add(done.queue_s)
        elif done.outcome == "failure":
            entry["fail"].add(done.total_s)
        entry["failures"][triton_reason(done.outcome, done.reason)] += 1

    def batch_done(self, done: BatchDone) -> None:
        if not done.ok:
            return
        entry = self._entry(done.model)
        entry["inference_count"] += done.rows
        entry["execution_count"] += 1
        # The same figure for every request of the batch: set once a batch.
        entry["last_inference"] = int(time.time() * 1000)
        entry["compute_input"].add(done.input_s, done.requests)
        entry["compute_infer"].add(done.infer_s, done.requests)
        entry["compute_output"].add(done.output_s, done.requests)
        batch = entry["batches"].setdefault(done.rows, _BatchStats())
        batch.compute_input.add(done.input_s)
        batch.compute_infer.add(done.infer_s)
        batch.compute_output.add(done.output_s)

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        return None

    def cache_looked_up(self, model: ModelKey, *, hit: bool, seconds: float) -> None:
        """A request to ``model`` was looked up in the response cache: a hit (the time of
        the lookup) or a miss (the lookup's and the insertion's), as Triton counts them."""
        entry = self._entry(model)
        entry["cache_hit" if hit else "cache_miss"].add(seconds)
        if hit:
            entry["last_inference"] = int(time.time() * 1000)

    def triton_counters(self, model: ModelKey) -> dict[str, Any]:
        """The figures behind Triton's ``nv_inference_*`` metrics for ``model``:
        counts, durations in nanoseconds, and failures by Triton's reason."""
        entry = self._entry(model)
        failures = dict(entry["failures"])
        return {
            "success": failures.pop("SUCCESS"),
            "failures": failures,
            "inference_count": entry["inference_count"],
            "execution_count": entry["execution_count"],
            "request_ns": entry["success"].ns + entry["fail"].ns,
            "cache_hits": entry["cache_hit"].count,
            "cache_hit_ns": entry["cache_hit"].ns,
            "cache_misses": entry["cache_miss"].count,
            "cache_miss_ns": entry["cache_miss"].ns,
            **{
                f"{phase}_ns": entry[phase].ns
                for phase in ("queue", "compute_input", "compute_infer", "compute_output")
            },
        }

    def triton_json(self, models: list[ModelKey]) -> dict[str, Any]:
        """Return ``{"model_stats": [...]}`` for ``models`` as Triton's extension shapes it."""
        out = []
        for model in models:
            entry = self._entry(model)
            out.append(
                {
                    "name": model.name,
                    "version": model.version,
                    "last_inference": entry["last_inference"],
                    "inference_count": entry["inference_count"],
                    "execution_count": entry["execution_count"],
                    "inference_stats": {
                        key: entry[key].as_dict()
                        for key in (
                            "success", "fail", "queue",
                            "compute_input", "compute_infer", "compute_output",
                            "cache_hit", "cache_miss",
                        )
                    },
                    "response_stats": {},
                    "batch_stats": [
                        {
                            "batch_size": size,
                            "compute_input": b.compute_input.as_dict(),
                            "compute_infer": b.compute_infer.as_dict(),
                            "compute_output": b.compute_output.as_dict(),
                        }
                        for size, b in sorted(entry["batches"].items())
                    ],
                    "memory_usage": [],
                }
            )  # fmt: skip
        return {"model_stats": out}
