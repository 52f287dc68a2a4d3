"""bench/bench_diffusion.py --export: W3's rows on the tiny SD fixture, end to end.

The real runtime (worker processes, the arena) serves tests/fixtures/sd/tiny-sd once per
row; the arrivals are tiny (capacity given, 1.5 s, 2 steps), so what is checked is
behaviour: the four rows, every request ending in an image or an explicit error, the
images compared with their full-step references. Speed is the benchmark's business.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from bench.bench_diffusion import ROWS, main_async, parser

FIXTURE = Path(__file__).parent.parent / "fixtures" / "sd" / "tiny-sd"


@pytest.mark.timeout(300)  # five runtimes start and stop on a shared machine
async def test_w3_runs_on_an_export_and_accounts_for_every_request() -> None:
    tiny = ["--steps", "2", "--seconds", "1.5", "--capacity", "8", "--no-save"]
    args = parser().parse_args(["--export", str(FIXTURE), *tiny])
    payload = await main_async(args)
    rows = payload["rows"]
    assert [r["row"] for r in rows] == [name for _, name in ROWS]
    arrivals = payload["arrivals"]
    assert arrivals > 0 and payload["steps"] == 2
    for r in rows:
        assert r["premium_requests"] + r["free_requests"] == arrivals
        served = arrivals - r["premium_dropped"] - r["free_dropped"]
        for cls in ("premium", "free"):
            assert sum(r[f"{cls}_drop_reasons"].values()) == r[f"{cls}_dropped"]
        # Every served image was compared with the full-step image of its request.
        assert r["compared"] == served > 0
        assert 1 <= r["mean_steps"] <= 2
        assert math.isfinite(r["mean_abs_diff"]) and r["mean_abs_diff"] >= 0
    request_level, step_level, _, reuse = rows
    # Neither degraded nor reused: the full-step image, up to a batch's float rounding.
    for r in (request_level, step_level):
        assert r["compared_changed"] == 0
        assert r["mean_abs_diff"] < 1 / 255
    # Ten prompts, more arrivals: later requests of a prompt start from its cached state,
    # and their images are their own, not the full-step image.
    assert reuse["reuse_hits"] > 0
    assert reuse["compared_changed"] > 0 and reuse["mean_abs_diff_changed"] > 0
