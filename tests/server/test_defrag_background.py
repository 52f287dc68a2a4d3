"""A requested defragmentation of a large arena runs in the background: requests keep
being answered while it moves hundreds of megabytes, and it reaches what one pass would.

Real server, real worker processes, real ONNX Runtime; the arena is fragmented with
:func:`sordino.testing.fragment_arena` (every block holds its index).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import numpy as np

from sordino.config import RuntimeConfig
from sordino.config.memory import MemoryConfig
from sordino.models.repository import builtin_sources
from sordino.testing import Fragmentation, fragment_arena, serve_in_thread
from tests.conftest import digits_pixels
from tests.waiting import wait_for

DIGITS = "digits-classifier"


def test_requests_are_answered_while_a_large_arena_is_defragmented(
    reference: dict[str, Any],
) -> None:
    config = RuntimeConfig(memory=MemoryConfig(pool_size="1GB", defrag_interval=0))
    sources = [s for s in builtin_sources() if s.name == DIGITS]
    pixels = digits_pixels(8, seed=3)
    session = reference[DIGITS]
    expected = session.run(None, {session.get_inputs()[0].name: pixels})[0]
    with serve_in_thread(config, sources) as server:
        runtime = server.runtime
        with httpx.Client(base_url=server.url, timeout=60) as client:
            url = f"/v2/models/{DIGITS}/infer"

            def infer(row: int) -> float:
                body = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                                    "data": pixels[row].tolist()}]}  # fmt: skip
                started = time.perf_counter()
                answer = client.post(url, json=body)
                took = time.perf_counter() - started
                assert answer.status_code == 200, answer.text
                outputs = answer.json()["outputs"]
                probabilities = next(o for o in outputs if o["name"] == "probabilities")
                got = np.asarray(probabilities["data"], np.float32)
                np.testing.assert_allclose(got, expected[row], rtol=1e-5, atol=1e-6)
                return took

            infer(0)  # the arena exists once a worker staged a batch

            async def fragment() -> tuple[Fragmentation, float]:
                held = fragment_arena(runtime, 0.9, pieces=128)
                goal, _, _ = runtime.executor.staging.arena.defragment_goal()
                return held, goal

            # Fragmented to 0.9: a single pass over it moves about 500 MB (3 s on a
            # busy 2-core machine, with no request answered meanwhile).
            held, goal = server.call(fragment())  # type: ignore[misc]
            kept = {int(t["block"][0]) for t in held.tensors}
            assert held.fragmentation >= 0.9 and goal < 0.1

            report: dict[str, Any] = {}

            def defrag() -> None:
                started = time.perf_counter()
                with httpx.Client(base_url=server.url, timeout=120) as admin:
                    answer = admin.post("/v2/sordino/memory/defrag")
                report.update(answer.json(), status=answer.status_code)
                report["took"] = time.perf_counter() - started

            runner = threading.Thread(target=defrag)
            runner.start()
            latencies: list[float] = []
            while runner.is_alive():
                latencies.append(infer(len(latencies) % len(pixels)))
            runner.join()

        assert report["status"] == 200, report
        # Requests kept being answered all along: one at a time, so three or more answers
        # while the defragmentation ran mean none waited for its whole run. (A bound on
        # each latency against the run's length failed on a loaded 2-core machine.)
        assert len(latencies) >= 3, (latencies, report)
        assert report["bytes_moved"] >= 128 << 20, report
        # The goal is reached, as the arena stands once no request is in flight, but for
        # the place of the blocks requests held or took while the pass ran, against the
        # 0.9 the arena started at:
        # - one placed between the blocks the pass packs leaves, once its request ends,
        #   a hole of its size (320 bytes seen: fragmentation 4.6e-7 and 5.8e-7 under
        #   load, with the same blocks and bytes in use);
        # - one in use when the pass began cannot move (the report's pinned_blocks): the
        #   pieces packed around it can leave, once its request ends, a hole of up to one
        #   piece (1/66 of the free space, seen once in a clean-clone run under load).
        piece = int(held.tensors[0]["block"].nbytes)

        def at_goal() -> bool:
            stats = server.call(_statistics(runtime))  # type: ignore[misc]
            slack = report["pinned_blocks"] * piece / stats.free_bytes if stats.free_bytes else 0
            return bool(stats.fragmentation <= goal + 1e-3 + slack)

        wait_for(at_goal, f"the arena at its defragmentation goal ({report})")
        assert report["steps"] > 1 and report["pause_s"] < report["duration_s"] / 3, report

        async def check_and_release() -> tuple[set[int], bool]:
            firsts = {int(t["block"][0]) for t in held.tensors}
            uniform = all(bool((t["block"] == t["block"][0]).all()) for t in held.tensors)
            held.release()
            return firsts, uniform

        firsts, uniform = server.call(check_and_release())  # type: ignore[misc]
        assert firsts == kept and uniform, "a moved block lost its contents"


async def _statistics(runtime: Any) -> Any:
    """The arena's statistics now (on the server's loop)."""
    return runtime.executor.staging.arena.statistics()
