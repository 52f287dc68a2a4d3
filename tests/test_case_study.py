"""The brief's case study: an image-generation service at peak traffic.

The memory manager, the guardian and the diffusion workload together on one real server
(worker process, shared-memory arena, the built-in ``digits-diffusion``):

- premium (priority high) and free (priority low) generations arrive on a schedule,
  free at about five times the premium rate;
- the arena is fragmented past the guardian's threshold while the generations' state
  lives in it, so ``trigger_defrag`` makes the memory manager move blocks under load;
- the diffusion model's request rate holds above the trigger's level, so
  ``degrade_steps`` cuts the steps of iterative models while the peak lasts.

What must hold: every request ends in an image or an explicit error (none lost, no
5xx other than an explicit 503); premium images are never degraded and are the very
bytes the same request gives on a quiet server (so moving generation state kept its
contents); free images got fewer steps while the guardian held the peak; the guardian
left one record per action with before/after figures; and the arena gives every byte
back afterwards.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from sordino.config import RuntimeConfig
from sordino.models.repository import builtin_sources
from sordino.testing import Fragmentation, RunningServer, fragment_arena, serve_in_thread
from tests.execution.load import events
from tests.waiting import wait_for

GENERATE = "/v2/models/digits-diffusion/generate"
STEPS = 20
FRAGMENTATION_THRESHOLD = 0.5


def _config() -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {
            "memory": {"strategy": "fragmentation_aware"},
            "self_healing": {
                "enabled": True,
                "triggers": [
                    {
                        "metric": "memory_fragmentation",
                        "threshold": f"{FRAGMENTATION_THRESHOLD:.0%}",
                        "window": "1s",
                        "action": "trigger_defrag",
                    },
                    {
                        "metric": "qps",
                        "model": "digits-diffusion",
                        "threshold": "> 4",
                        "window": "2s",
                        "action": "degrade_steps 50%",
                    },
                ],
            },
        }
    )


def _body(seed: int, priority: str) -> dict[str, Any]:
    return {
        "prompt": f"a handwritten {seed % 10}",
        "steps": STEPS,
        "seed": seed,
        "parameters": {"priority": priority},
    }


def _records(server: RunningServer, action: str) -> list[dict[str, Any]]:
    records = [e.payload for e in events(server, "guardian") if e.payload["phase"] != "acted"]
    return [r for r in records if r["action"].split()[0] == action]


async def _fragment(server: RunningServer) -> Fragmentation:
    return fragment_arena(server.runtime, 0.7)


async def _release(held: Fragmentation) -> None:
    held.release()


async def _peak(server: RunningServer) -> list[tuple[str, int, httpx.Response]]:
    """Premium every 250 ms, free every 50 ms, until both guardian actions have acted
    (at least 4 s, at most 60 s); then wait for every answer."""
    answers: list[tuple[str, int, httpx.Response]] = []
    limits = httpx.Limits(max_connections=64)
    async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as client:

        async def one(kind: str, seed: int) -> None:
            headers = {"x-sordino-tenant": kind}
            response = await client.post(
                GENERATE, json=_body(seed, "high" if kind == "premium" else "low"), headers=headers
            )
            answers.append((kind, seed, response))

        tasks: list[asyncio.Task[None]] = []
        started = time.monotonic()
        tick = 0
        while True:
            elapsed = time.monotonic() - started
            acted = _records(server, "trigger_defrag") and _records(server, "degrade_steps")
            if elapsed > 60 or (elapsed > 4 and acted):
                break
            if tick % 5 == 0:
                tasks.append(asyncio.create_task(one("premium", 1000 + tick // 5)))
            tasks.append(asyncio.create_task(one("free", 5000 + tick)))
            tick += 1
            await asyncio.sleep(0.05)
        await asyncio.gather(*tasks)
        assert len(answers) == len(tasks)  # every request ended in an answer
    return answers


def test_peak_generation_with_memory_manager_and_guardian() -> None:
    sources = [s for s in builtin_sources() if s.name == "digits-diffusion"]
    with serve_in_thread(_config(), sources) as server:
        runtime = server.runtime
        held = server.call(_fragment(server))
        assert isinstance(held, Fragmentation) and held.fragmentation >= 0.7
        try:
            answers = asyncio.run(_peak(server))
        finally:
            server.call(_release(held))
        defrags = _records(server, "trigger_defrag")
        degrades = _records(server, "degrade_steps")
        statistics = runtime.memory.statistics()

        # The same premium requests on a quiet server (another tenant: no cache hit).
        premium_seeds = sorted({seed for kind, seed, _ in answers if kind == "premium"})
        with httpx.Client(base_url=server.url, timeout=60) as client:
            quiet = {
                seed: client.post(
                    GENERATE,
                    json=_body(seed, "high"),
                    headers={"x-sordino-tenant": "reference"},
                ).json()
                for seed in premium_seeds
            }
        arena = runtime.executor.staging.arena
        wait_for(
            lambda: arena.statistics().in_use_bytes == 0, "the arena to give every byte back", 30
        )

    statuses = {response.status_code for _, _, response in answers}
    assert statuses <= {200, 503}, statuses
    for _, _, response in answers:
        if response.status_code == 503:
            assert response.json()["error"], response.text  # explicit, never silent

    premium = [(seed, r.json()) for kind, seed, r in answers if kind == "premium"]
    assert premium and all(r.status_code == 200 for k, _, r in answers if k == "premium")
    for seed, body in premium:
        assert body["parameters"]["steps_used"] == STEPS, body["parameters"]
        assert body["parameters"]["degraded"] is False
        assert body["png"] == quiet[seed]["png"], f"premium seed {seed} differs from quiet"

    free = [r.json()["parameters"] for k, _, r in answers if k == "free" and r.status_code == 200]
    assert any(p["steps_used"] < STEPS for p in free), "no free generation was degraded"
    assert all(p["steps_used"] >= 1 for p in free)

    (defrag,) = defrags[:1]
    assert defrag["parameters"]["fragmentation_before"] >= FRAGMENTATION_THRESHOLD
    assert defrag["parameters"]["fragmentation_after"] < FRAGMENTATION_THRESHOLD
    assert defrag["parameters"]["bytes_moved"] > 0
    assert statistics.defrag_runs >= 1
    (degrade,) = degrades[:1]
    assert degrade["parameters"]["factor"] == 0.5
    assert "qps of digits-diffusion" in degrade["explanation"], degrade["explanation"]
