"""Judging a live change: did p99 or the error rate get worse after it?

The rows are the per-second series (:class:`~sordino.telemetry.series.SecondRow`) of
each model for the same span before and after the change. A model is worse when its
request-weighted p99 rose by more than ``p99_ratio`` *and* ``p99_margin_ms``, or its
error rate rose by more than ``error_rate_margin``. Seconds without requests carry no
weight; a model without requests on either side cannot be judged and is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sordino.config.reconfigure import ReconfigureConfig
from sordino.inference import ModelKey
from sordino.telemetry.series import SecondRow

__all__ = ["Verdict", "WindowFigures", "judge", "window_figures"]


@dataclass(frozen=True, slots=True)
class WindowFigures:
    """One model's requests, weighted p99 (ms, None without requests) and error rate."""

    requests: int
    p99_ms: float | None
    error_rate: float

    def to_json(self) -> dict[str, object]:
        p99 = None if self.p99_ms is None else round(self.p99_ms, 2)
        return {"requests": self.requests, "p99_ms": p99, "error_rate": round(self.error_rate, 4)}


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether the change made things worse, and the sentence that says why (or why not)."""

    worse: bool
    reason: str
    before: dict[str, WindowFigures]
    after: dict[str, WindowFigures]

    def to_json(self) -> dict[str, object]:
        return {
            "worse": self.worse,
            "reason": self.reason,
            "before": {k: v.to_json() for k, v in self.before.items()},
            "after": {k: v.to_json() for k, v in self.after.items()},
        }


def window_figures(rows: Sequence[SecondRow]) -> WindowFigures:
    """Sum the requests and errors of ``rows``; weight each second's p99 by its requests."""
    requests = sum(row.requests for row in rows)
    errors = sum(row.errors for row in rows)
    weighted = [(row.p99_ms, row.requests) for row in rows if row.p99_ms is not None]
    weight = sum(count for _, count in weighted)
    p99 = sum(value * count for value, count in weighted) / weight if weight else None
    return WindowFigures(requests, p99, errors / requests if requests else 0.0)


def judge(
    before: Mapping[ModelKey, Sequence[SecondRow]],
    after: Mapping[ModelKey, Sequence[SecondRow]],
    config: ReconfigureConfig,
) -> Verdict:
    """Compare each model's figures after the change with those before it."""
    figures_before = {str(key): window_figures(rows) for key, rows in before.items()}
    figures_after = {str(key): window_figures(rows) for key, rows in after.items()}
    reasons: list[str] = []
    judged = 0
    for model, now in sorted(figures_after.items()):
        then = figures_before.get(model)
        if then is None or not then.requests or not now.requests:
            continue
        judged += 1
        if now.error_rate - then.error_rate > config.error_rate_margin:
            reasons.append(f"{model}: error rate {then.error_rate:.1%} -> {now.error_rate:.1%}")
        if then.p99_ms is not None and now.p99_ms is not None:
            rise = now.p99_ms - then.p99_ms
            if now.p99_ms > then.p99_ms * config.p99_ratio and rise > config.p99_margin_ms:
                reasons.append(f"{model}: p99 {then.p99_ms:.1f} ms -> {now.p99_ms:.1f} ms")
    if reasons:
        return Verdict(True, "worse: " + "; ".join(reasons), figures_before, figures_after)
    if not judged:
        why = "no model had requests both before and after the change; kept unjudged"
        return Verdict(False, why, figures_before, figures_after)
    return Verdict(False, f"no worse on {judged} model(s)", figures_before, figures_after)
