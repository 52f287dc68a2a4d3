"""The tuning advisor: sweep a model's live settings with short open-loop runs.

For each candidate — max batch size, batching delay and scheduler mode, the settings
a running server changes live (instance count and intra-op threads need a reload and
are not swept) — :func:`sweep` applies it through the server's reconfigure API, then
sends constant-rate open-loop traffic at each rate of a ladder (the stress-test
engine). A candidate's throughput is the highest rate it served with p99 under the
objective's bound and under 1 % errors; its p99 is the one measured at that rate.
:func:`pareto` keeps the candidates no other beats on both throughput and p99;
:func:`recommend` picks the one the objective asks for. The live settings are put
back when the sweep ends.

A ladder's rungs are far apart (each twice the last), so two settings between the
same rungs measure equal. :func:`refine` settles a throughput objective: for the live
settings and the recommendation it bisects the rate between each one's last rung
within the bound and its first rung past it, the two measured alternately (one run
of each per step, so a stall of the shared machine hits both alike), and reports the
highest rate each served within the objective.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sordino.errors import ConfigError
from sordino.loadtest.profiles import Profile, Segment, TrafficClass
from sordino.loadtest.run import execute, prepare

__all__ = [
    "Candidate",
    "Objective",
    "Point",
    "pareto",
    "parse_objective",
    "recommend",
    "refine",
    "sweep",
]

_OBJECTIVE = re.compile(
    r"^\s*(?P<goal>max(?:imi[sz]e)?\s+throughput|min(?:imi[sz]e)?\s+p99)"
    r"(?:\s+with\s+p99\s*<\s*(?P<bound>[\d.]+)\s*ms)?\s*$",
    re.IGNORECASE,
)
MAX_ERROR_RATE = 0.01
RETRIES = 1


@dataclass(frozen=True, slots=True)
class Objective:
    """What to optimise: ``throughput`` (under ``p99_ms``) or ``p99``."""

    goal: str
    p99_ms: float | None

    def met(self, p99_ms: float | None, error_rate: float) -> bool:
        """Whether a run with this p99 and error rate meets the objective's bound."""
        if error_rate > MAX_ERROR_RATE:
            return False
        return self.p99_ms is None or (p99_ms is not None and p99_ms <= self.p99_ms)

    def __str__(self) -> str:
        bound = f" with p99<{self.p99_ms:g}ms" if self.p99_ms is not None else ""
        return f"{'max throughput' if self.goal == 'throughput' else 'min p99'}{bound}"


def parse_objective(text: str) -> Objective:
    """``"max throughput with p99<50ms"`` or ``"min p99"`` -> an :class:`Objective`."""
    match = _OBJECTIVE.match(text)
    if match is None:
        raise ConfigError(
            f"objective {text!r} is not understood; write 'max throughput with p99<50ms', "
            "'max throughput' or 'min p99'"
        )
    goal = "throughput" if "throughput" in match["goal"].lower() else "p99"
    return Objective(goal, float(match["bound"]) if match["bound"] else None)


@dataclass(frozen=True, slots=True)
class Candidate:
    """One setting of the model's live keys."""

    max_batch: int
    delay_us: int
    mode: str

    def settings(self, model: str) -> dict[str, Any]:
        """The ``--set`` assignments of this candidate."""
        prefix = f"models.{model}"
        return {
            f"{prefix}.dynamic_batching.max_batch": self.max_batch,
            f"{prefix}.dynamic_batching.max_queue_delay_microseconds": self.delay_us,
            f"{prefix}.scheduler_mode": self.mode,
        }

    def label(self) -> str:
        return f"max_batch {self.max_batch}, delay {self.delay_us} µs, {self.mode}"


def live_settings(model: str, config: dict[str, Any]) -> dict[str, Any]:
    """The keys a candidate sets, as ``config`` (the model's ``/v2/sordino/config``
    entry) has them now: what a sweep restores at its end."""
    batching = config.get("dynamic_batching") or {}
    prefix = f"models.{model}"
    return {
        f"{prefix}.dynamic_batching.max_batch": batching.get("max_batch"),
        f"{prefix}.dynamic_batching.max_queue_delay_microseconds": batching.get(
            "max_queue_delay_microseconds"
        ),
        f"{prefix}.scheduler_mode": config.get("scheduler_mode"),
    }


@dataclass(frozen=True, slots=True)
class Point:
    """What a candidate achieved: rows per second within the bound, and its p99 there."""

    candidate: Candidate | None
    throughput: float
    p99_ms: float | None
    runs: tuple[tuple[float, float, float | None, float], ...]
    """(intended rate, achieved rate, p99 ms, error rate) per rung of the ladder."""

    def to_json(self) -> dict[str, Any]:
        return {
            "candidate": None if self.candidate is None else self.candidate.label(),
            "throughput": round(self.throughput, 1),
            "p99_ms": None if self.p99_ms is None else round(self.p99_ms, 2),
            "runs": [list(run) for run in self.runs],
        }


def candidates(
    max_batch: Sequence[int], delays_us: Sequence[int], modes: Sequence[str]
) -> list[Candidate]:
    return [Candidate(b, d, m) for b, d, m in itertools.product(max_batch, delays_us, modes)]


def measure(
    url: str,
    model: str,
    rates: Sequence[float],
    seconds: float,
    objective: Objective,
    candidate: Candidate | None,
) -> Point:
    """Run the rate ladder (blocking); stop at the first rung that misses the bound twice.

    A rung that misses is run once more before the ladder stops: on a shared machine
    one stall is enough to push a short run's p99 past the bound.
    """
    runs: list[tuple[float, float, float | None, float]] = []
    best, best_p99 = 0.0, None
    for rate in rates:
        for _attempt in range(1 + RETRIES):
            achieved, p99, error_rate = _run(url, model, rate, seconds)
            runs.append((rate, round(achieved, 1), p99, round(error_rate, 4)))
            if objective.met(p99, error_rate):
                break
        else:
            break
        if achieved > best:
            best, best_p99 = achieved, p99
    return Point(candidate, best, best_p99, tuple(runs))


def _run(url: str, model: str, rate: float, seconds: float) -> tuple[float, float | None, float]:
    """One constant-rate open-loop run: achieved rate, p99 (ms) and error rate."""
    profile = Profile(
        name="tune",
        arrivals="constant",
        segments=(Segment(duration=seconds, rate=rate),),
        mix=(TrafficClass(),),
    )
    result = execute(prepare(url, model, profile), poll_metrics=False, timeout_s=10)
    total = result.total
    served = total.count - total.errors
    achieved = served / max(seconds, result.send.elapsed_s)
    error_rate = total.errors / total.count if total.count else 1.0
    return achieved, total.p99_ms, error_rate


def sweep(
    url: str,
    model: str,
    grid: Sequence[Candidate],
    *,
    rates: Sequence[float],
    seconds: float,
    objective: Objective,
    apply: Callable[[dict[str, Any]], None],
    restore: dict[str, Any],
    progress: Callable[[Point], None] | None = None,
) -> tuple[Point, list[Point]]:
    """Measure the live settings (the baseline), then each candidate; restore at the end.

    A first run at the lowest rate warms the server and the client up, unrecorded.
    """
    _run(url, model, min(rates), min(seconds, 1.0))
    try:
        baseline = measure(url, model, rates, seconds, objective, None)
        if progress is not None:
            progress(baseline)
        points = []
        for candidate in grid:
            apply(candidate.settings(model))
            point = measure(url, model, rates, seconds, objective, candidate)
            points.append(point)
            if progress is not None:
                progress(point)
    finally:
        apply(restore)
    return baseline, points


def _bracket(point: Point, objective: Objective) -> tuple[float, float]:
    """The highest intended rate ``point``'s ladder met the objective at (0: none) and
    the lowest it missed at (twice the top rung when it met them all)."""
    met = [rate for rate, _, p99, errors in point.runs if objective.met(p99, errors)]
    missed = [rate for rate, _, p99, errors in point.runs if not objective.met(p99, errors)]
    low = max(met, default=0.0)
    above = [rate for rate in missed if rate > low]
    if above:
        return low, min(above)
    return low, 2 * max((rate for rate, *_ in point.runs), default=1.0)


def refine(
    url: str,
    model: str,
    contenders: Sequence[tuple[dict[str, Any], Point]],
    *,
    steps: int,
    seconds: float,
    objective: Objective,
    apply: Callable[[dict[str, Any]], None],
    restore: dict[str, Any],
) -> list[Point]:
    """Bisect each contender's highest rate within ``objective``, the contenders in turn.

    ``contenders`` are (settings, the point the ladder measured for them). Each step
    applies each contender's settings and runs it at the geometric middle of its
    bracket (a miss is run once more, as on the ladder); the bracket halves around the
    outcome. Return one point per contender: the best achieved rate within the
    objective over the ladder and these runs, its p99, and every run. The live
    settings (``restore``) are put back at the end.
    """
    brackets = [list(_bracket(point, objective)) for _, point in contenders]
    runs = [list(point.runs) for _, point in contenders]
    best = [(point.throughput, point.p99_ms) for _, point in contenders]
    try:
        for _step in range(steps):
            for index, (settings, _) in enumerate(contenders):
                low, high = brackets[index]
                rate = math.sqrt(low * high) if low > 0 else high / 2
                apply(settings)
                for _attempt in range(1 + RETRIES):
                    achieved, p99, error_rate = _run(url, model, rate, seconds)
                    runs[index].append(
                        (round(rate, 1), round(achieved, 1), p99, round(error_rate, 4))
                    )
                    met = objective.met(p99, error_rate)
                    if met:
                        break
                if met:
                    brackets[index][0] = rate
                    if achieved > best[index][0]:
                        best[index] = (achieved, p99)
                else:
                    brackets[index][1] = rate
    finally:
        apply(restore)
    return [
        Point(point.candidate, best[i][0], best[i][1], tuple(runs[i]))
        for i, (_, point) in enumerate(contenders)
    ]


def pareto(points: Sequence[Point]) -> list[Point]:
    """The points no other point beats on throughput and p99 both (throughput first)."""
    measured = [p for p in points if p.p99_ms is not None and p.throughput > 0]
    front = [
        p
        for p in measured
        if not any(
            q is not p
            and q.throughput >= p.throughput
            and q.p99_ms <= p.p99_ms  # type: ignore[operator]
            and (q.throughput > p.throughput or q.p99_ms < p.p99_ms)  # type: ignore[operator]
            for q in measured
        )
    ]
    return sorted(front, key=lambda p: -p.throughput)


def recommend(points: Sequence[Point], objective: Objective) -> Point | None:
    """The point the objective prefers (ties: the lower p99, then the higher throughput)."""
    front = pareto(points)
    if not front:
        return None
    if objective.goal == "throughput":
        return max(front, key=lambda p: (p.throughput, -(p.p99_ms or 0.0)))
    return min(front, key=lambda p: (p.p99_ms or 0.0, -p.throughput))
