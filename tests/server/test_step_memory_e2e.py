"""Multi-step requests on a real server: intermediates released step by step, planned.

A 20-step stream is read line by line; after each line the arena's bytes in use are
read on the server's loop. Were a step's intermediates kept after the next step
consumed them, the figure would grow with the steps; it stays at a few steps' worth.
The finished request's steps are laid out greedy by size: the planned region is
reported next to the naive sum. The steps' outputs ran in one region of the request,
reserved at the plan of its outputs, and used to exactly that size.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import RuntimeConfig
from sordino.memory.allocator import ALIGNMENT
from sordino.models.repository import builtin_sources
from sordino.testing import serve_in_thread
from tests.waiting import wait_for

STEPS = 20


def test_twenty_steps_keep_in_use_bounded_and_are_planned() -> None:
    sources = [s for s in builtin_sources() if s.name == "countdown"]
    with serve_in_thread(RuntimeConfig(), sources) as server:
        runtime = server.runtime

        async def in_use() -> int:
            arena = runtime.memory.owner.existing()
            return arena.statistics().in_use_bytes if arena is not None else 0

        seen: list[int] = []
        remaining: list[str] = []
        url = f"{server.url}/v2/models/countdown/generate_stream"
        with httpx.stream("POST", url, json={"COUNT": STEPS}, timeout=60) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if "REMAINING" in line:
                    remaining.append(line)
                    seen.append(server.call(in_use()))  # type: ignore[arg-type]
        assert len(remaining) == STEPS
        step = max(seen[:3])
        assert step > 0
        # 20 steps ran; what stays in use never exceeds a few steps' worth.
        assert max(seen) <= 4 * step, seen
        final: Any = server.call(in_use())
        assert final == 0  # everything given back once the request ended
        (plan,) = runtime.memory.statistics().plans
        assert plan.model == "countdown" and plan.requests == 1 and plan.steps == STEPS
        assert 0 < plan.planned_peak_bytes * 5 < plan.naive_bytes
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        assert 'sordino_memory_plan_planned_peak_bytes{model="countdown"}' in metrics
        assert f'sordino_memory_plan_region_peak_bytes{{model="countdown"}} {4 * ALIGNMENT}' in (
            metrics
        )
        # The steps' outputs ran in one region of the request, reserved at the plan's
        # size: REMAINING and DONE (one element each, 64 bytes aligned) of two steps.
        assert plan.regions == 1 and plan.region_bytes == 4 * ALIGNMENT
        assert plan.region_peak_bytes == plan.region_bytes  # what really happened
        assert plan.region_fallbacks == 0
        result = CliRunner().invoke(cli, ["memory", "status", "--url", server.url])
        assert result.exit_code == 0 and f"plan countdown: 1 requests; last {STEPS} steps" in (
            result.output
        )
        assert f"outputs in one region of {4 * ALIGNMENT} bytes" in result.output


def test_a_generation_runs_its_steps_in_one_region_of_one_steps_outputs() -> None:
    """digits-diffusion: the sampler reads step k's outputs within step k, so the region
    is planned at one step's outputs, and that is exactly what its steps used. The image
    is the one the same model makes in the server's process (no arena, no region)."""
    (source,) = [s for s in builtin_sources() if s.name == "digits-diffusion"]
    body = {"prompt": "a 7", "steps": 8, "seed": 3}
    threaded = dataclasses.replace(
        source, config=source.config.model_copy(update={"isolation": "thread"})
    )
    with serve_in_thread(RuntimeConfig(), [threaded]) as server:
        url = f"{server.url}/v2/models/digits-diffusion/generate"
        reference = httpx.post(url, json=body, timeout=60)
        assert reference.status_code == 200, reference.text
        # Observers hear of the finished request a loop step after its answer is written.
        memory = server.runtime.memory
        wait_for(lambda: memory.statistics().plans, "the thread instance's step plan")
        assert not memory.statistics().plans[0].regions
    with serve_in_thread(RuntimeConfig(), [source]) as server:
        runtime = server.runtime
        answer = httpx.post(
            f"{server.url}/v2/models/digits-diffusion/generate", json=body, timeout=60
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["image"] == reference.json()["image"]
        # The scheduler's observers hear of a finished request a loop step after its
        # answer is written: the plan is read once they have.
        wait_for(lambda: runtime.memory.statistics().plans, "the step plan's statistics")
        (plan,) = runtime.memory.statistics().plans
        assert plan.model == "digits-diffusion" and plan.regions == 1
        assert plan.region_bytes > 0 and plan.region_fallbacks == 0
        assert plan.region_peak_bytes == plan.region_bytes

        async def in_use() -> int:
            arena = runtime.memory.owner.existing()
            return arena.statistics().in_use_bytes if arena is not None else 0

        assert server.call(in_use()) == 0  # the region went back with the request
