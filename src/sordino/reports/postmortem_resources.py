"""A postmortem's resource utilisation: mean and peak of each resource the journal records.

:func:`resource_use` gives one :class:`ResourceUse` per resource (server CPU and
memory, the arena, GPU memory, each model's instances busy); :func:`utilisation`
the notes the table does not say.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sordino.telemetry.journal_reader import JournalWindow

__all__ = ["ResourceUse", "resource_use", "utilisation"]


@dataclass(frozen=True, slots=True)
class ResourceUse:
    """One resource over the period: its mean and its peak second, in ``unit``.

    Means are over the seconds the journal holds a figure for (``seconds``); shares
    (``unit == "%"``) are percentages.
    """

    resource: str
    unit: str
    mean: float
    peak: float
    peak_at: int
    seconds: int


def utilisation(window: JournalWindow) -> list[str]:
    """What the table of :func:`resource_use` does not say."""
    out = []
    pool = [r.pool_in_use_bytes for r in window.resources if r.pool_in_use_bytes is not None]
    reserved = [r.pool_reserved_bytes for r in window.resources if r.pool_reserved_bytes]
    if pool and reserved:
        out.append(
            f"Shared-memory pool: up to {max(pool) / 2**20:.1f} MiB in use of "
            f"{max(reserved) / 2**20:.0f} MiB."
        )
    if window.resources:
        out.append(
            "Server CPU is the server process's, in percent of one core; the worker "
            "processes' CPU is not journaled: their instances' busy share stands for it."
        )
    return out or ["The journal holds no utilisation rows for this period."]


def _use(resource: str, unit: str, points: list[tuple[int, float]]) -> ResourceUse | None:
    if not points:
        return None
    peak_at, peak = max(points, key=lambda p: p[1])
    mean = float(np.mean([v for _, v in points]))
    return ResourceUse(resource, unit, mean, peak, peak_at, len(points))


def resource_use(window: JournalWindow) -> list[ResourceUse]:
    """Mean and peak of each resource the journal records each second.

    Server CPU is the server process's (percent of one core: more than 100 on several);
    the worker processes' CPU is not journaled, their instances' busy share (the share
    of their time spent computing, per model) stands for it. The arena's use is its
    bytes in use as a share of those reserved. GPU memory appears where a GPU was seen.
    """
    res = window.resources
    found = [
        _use("server CPU (% of one core)", "%", [(r.t, r.cpu_percent) for r in res]),
        _use("server resident memory", "MiB", [(r.t, r.rss_bytes / 2**20) for r in res]),
        _use(
            "arena in use (share of reserved)",
            "%",
            [
                (r.t, 100 * r.pool_in_use_bytes / r.pool_reserved_bytes)
                for r in res
                if r.pool_in_use_bytes is not None and r.pool_reserved_bytes
            ],
        ),
        _use(
            "arena fragmentation",
            "%",
            [(r.t, 100 * r.fragmentation) for r in res if r.fragmentation is not None],
        ),
        _use(
            "GPU memory used",
            "MiB",
            [
                (r.t, r.gpu_memory_used_bytes / 2**20)
                for r in res
                if r.gpu_memory_used_bytes is not None
            ],
        ),
    ]
    for model in window.models:
        rows = window.rows_of(model)
        if not any(r.requests for r in rows):
            continue
        per_second: dict[int, list[float]] = {}
        for r in rows:  # versions of one model in one second: their mean
            per_second.setdefault(r.t, []).append(r.busy)
        found.append(
            _use(
                f"{model}: instances busy",
                "%",
                [(t, 100 * float(np.mean(b))) for t, b in sorted(per_second.items())],
            )
        )
    return [u for u in found if u is not None]
