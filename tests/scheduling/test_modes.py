"""Mode controllers: AIMD steering, auto and hybrid choices from a batch curve."""

from __future__ import annotations

import math
import random

from sordino.scheduling.batcher import BatchPolicy
from sordino.scheduling.modes import (
    AimdController,
    BatchCurve,
    build_controller,
    measure_batch_curve,
)
from sordino.testing import VirtualClock

CEILING = BatchPolicy(max_batch=16, max_delay_s=0.016)


def _feed(ctl: AimdController, start: float, latency: float, n: int = 50) -> float:
    t = start
    for _ in range(n):
        t += 0.02
        ctl.observe(t, latency)
    return t


def test_aimd_cuts_when_p99_passes_slo() -> None:
    ctl = AimdController("adaptive", CEILING, slo_s=0.1)
    _feed(ctl, 0.0, 0.5)
    assert ctl.policy().max_batch < 16
    assert ctl.policy().max_delay_s < 0.016


def test_aimd_grows_back_while_latency_has_room() -> None:
    ctl = AimdController("adaptive", CEILING, slo_s=0.1)
    t = _feed(ctl, 0.0, 0.5)
    low = ctl.policy().max_batch
    _feed(ctl, t + 10, 0.001, n=400)
    assert ctl.policy().max_batch > low
    assert ctl.policy().max_batch <= 16


def test_aimd_holds_inside_band() -> None:
    ctl = AimdController("adaptive", CEILING, slo_s=0.1)
    _feed(ctl, 0.0, 0.085)
    assert ctl.policy().max_batch == 16
    assert ctl.statistics().adjustments == 0


def test_auto_picks_ultra_low_latency_when_batching_does_not_pay() -> None:
    linear = BatchCurve((1, 2, 4, 8), (0.001, 0.002, 0.004, 0.008))
    ctl = build_controller("auto", BatchPolicy(max_batch=8, max_delay_s=0.01), 0.1, linear)
    assert ctl.statistics().effective_mode == "ultra_low_latency"
    assert ctl.policy().max_delay_s == 0.0


def test_auto_picks_adaptive_when_batching_pays() -> None:
    flat = BatchCurve((1, 2, 4, 8), (0.001, 0.001, 0.0012, 0.0015))
    ctl = build_controller("auto", BatchPolicy(max_batch=8, max_delay_s=0.01), 0.1, flat)
    assert ctl.statistics().effective_mode == "adaptive"


def test_auto_caps_batch_where_throughput_stops_growing() -> None:
    # rows/s: 1000, 1818, 3333, 3478, 3404 -> 95 % of the best is first reached at 4 rows
    knee = BatchCurve((1, 2, 4, 8, 16), (0.001, 0.0011, 0.0012, 0.0023, 0.0047))
    ctl = build_controller("auto", BatchPolicy(max_batch=16, max_delay_s=0.01), 0.1, knee)
    assert ctl.statistics().effective_mode == "adaptive"
    assert ctl.policy().max_batch == 4


def test_auto_turns_batching_off_when_it_hurts() -> None:
    # A convolution on a CPU: rows/s fall as the batch grows.
    worse = BatchCurve((1, 2, 4), (0.0024, 0.0060, 0.0127))
    ctl = build_controller("auto", BatchPolicy(max_batch=4, max_delay_s=0.01), 0.1, worse)
    assert ctl.statistics().effective_mode == "ultra_low_latency"
    assert ctl.policy().max_batch == 1


def test_hybrid_caps_batch_to_slo_share() -> None:
    curve = BatchCurve((1, 2, 4, 8), (0.005, 0.01, 0.02, 0.04))
    ctl = build_controller("hybrid", BatchPolicy(max_batch=8, max_delay_s=0.01), 0.1, curve)
    assert ctl.policy().max_batch == 4  # 4 rows take 20 ms <= 25 ms (a quarter of 100 ms)


def test_unbatched_model_gets_batch_of_one() -> None:
    ctl = build_controller("adaptive", BatchPolicy(max_batch=1, max_delay_s=0.01), 0.1)
    assert ctl.policy().max_batch == 1 and ctl.policy().max_delay_s == 0.0


async def test_measure_batch_curve_times_each_size() -> None:
    clock = VirtualClock()
    seen: list[int] = []

    async def run(size: int) -> None:
        seen.append(size)
        clock._now += 0.001 * size  # the model takes 1 ms per row

    curve = await measure_batch_curve(run, clock, 8, repeats=1)
    assert curve.sizes == (1, 2, 4, 8)
    assert [round(x, 6) for x in curve.latencies_s] == [0.001, 0.002, 0.004, 0.008]


def test_aimd_grows_under_a_backlog_whatever_the_p99() -> None:
    """Overloaded (a full batch waiting), high latency is queueing: the cap grows, never shrinks."""
    ctl = AimdController("adaptive", CEILING, slo_s=0.1)
    t = _feed(ctl, 0.0, 0.5)  # first cut by a p99 over the SLO, with no backlog
    low = ctl.policy().max_batch
    for _ in range(100):
        t += 0.02
        ctl.observe(t, 0.5, backlog_rows=64)
    assert ctl.policy().max_batch == 16 > low


def test_aimd_reads_the_p99_of_its_window_alone() -> None:
    """The p99 is the sample at rank ⌈0.99·n⌉ of those in the last ``window_s``; what is
    older is forgotten (and the columns holding the window stay small)."""
    ctl = AimdController("adaptive", CEILING, slo_s=1.0, window_s=2.0, interval_s=0.5)
    latencies = [ms / 1000 for ms in range(1, 201)]
    random.Random(7).shuffle(latencies)
    t = 0.0
    for latency in latencies:  # 200 samples over 0.6 s: one adjustment at 0.5 s
        t += 0.003
        ctl.observe(t, latency)
    seen = latencies[: int(0.5 / 0.003) + 1]  # those observed up to the adjustment
    rank = math.ceil(0.99 * len(seen)) - 1
    assert ctl.statistics().p99_s == sorted(seen)[rank]
    for _ in range(3000):  # 3 s more at 5 ms: the first 200 leave the window
        t += 0.001
        ctl.observe(t, 0.005)
    assert ctl.statistics().p99_s == 0.005
    assert len(ctl._times) < 2 * 2000 + 10  # at most twice the window's samples kept
