"""The memory manager: fragmentation under drift, allocation cost, defragmentation pause.

1. **Drift trace** — 100k allocations on a 256 MiB arena, replayed against every
   strategy: batch buffers whose shapes drift (N rows -> N+1, the row width growing
   too), mixed small tensors and large batches, short lives (a few allocations), and
   long-lived streaming states among them. Fragmentation (1 - largest free block /
   free bytes) is sampled every 100 allocations after the first 10 %; the table gives
   its mean and p95 (steady state), the arena's mean use, and failed allocations.
2. **Allocation cost** — acquire + release of 4 KiB, 1 MiB and 64 MiB on an arena that
   holds a few hundred live blocks, per strategy, next to ``np.empty`` + first touch
   of every page (what a fresh buffer costs without an arena).
3. **Defragmentation pause** — a real shared-memory arena fragmented with parked blocks
   (``sordino.testing.fragment_arena``'s pattern), one ``Arena.defragment``: bytes
   moved and the pause, for 8 to 128 MiB of movable blocks; and the same arena
   compacted by ``Arena.shift`` steps of at most ``--step`` MiB (what
   ``memory.compact_step`` runs at every batch boundary): steps and pause per step.

The drift table's "steps" rows replay incremental compaction: a batch boundary after
every allocation (or every 2nd), each moving at most ``--step`` MiB of long-lived
blocks; "runs" is then the steps, "moved/run" the MiB moved per allocation.

    python -m bench.bench_memory [--allocations 100000] [--seed 7] [--load-seconds 20]

4. (with ``--load-seconds N``) **Defrag under load** — ``sordino start`` serving the
   digits classifier to 64 closed-loop clients for about N s, with and without
   ``--defrag-interval 10s``: p50/p99 and the defrag runs' pauses.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from rich.table import Table

from bench.common import RESULTS, console
from sordino.errors import OutOfMemory
from sordino.memory import Arena, Lease, TensorRef, Tensors
from sordino.memory.allocator import Block, Lifetime, Strategy
from sordino.memory.strategies import STRATEGIES, allocator_factory

MiB = 1 << 20
ARENA = 256 * MiB


@dataclass
class Event:
    """Allocate ``size`` bytes, to be freed after ``life`` further allocations."""

    size: int
    life: int
    lifetime: Lifetime


def drift_trace(allocations: int, seed: int) -> list[Event]:
    """Batch shapes drifting N -> N+1, small and large mixed, long-lived states among them."""
    rng = random.Random(seed)
    events: list[Event] = []
    rows, width = 8, 4096  # a batch of ``rows`` rows of ``width`` bytes
    for i in range(allocations):
        if i % 500 == 0:  # the shapes drift: one row more, a slightly wider row
            rows = 8 + (rows - 7) % 56
            width += 64
        kind = rng.random()
        if kind < 0.03:  # a stream's carried state: lives for thousands of allocations
            events.append(Event(rng.randint(64, 2048) * 1024, rng.randint(2000, 8000), "long"))
        elif kind < 0.55:  # small tensors (a request's inputs, a BYTES tensor)
            events.append(Event(rng.randint(1, 64) * 1024, rng.randint(1, 16), "short"))
        else:  # a batch's input and output buffers, the drifting shape
            batch = rows + rng.randint(-2, 2)
            size = max(1, batch) * width * rng.choice((1, 2, 4))
            events.append(Event(size, rng.randint(1, 24), "short"))
    return events


def compact(allocator: Strategy, dying: dict[int, list[tuple[Block, int]]], long: set[int]) -> int:
    """What ``Arena.defragment`` does to the allocator: re-place every long-lived block.

    Long-lived blocks stand for streams' carried state, parked in the queue between
    steps (movable); short-lived ones for running batches' buffers (pinned). Returns
    the bytes that changed place.
    """
    movable = [(at, i, b) for at, blocks in dying.items() for i, (b, _) in enumerate(blocks)
               if b.offset in long]  # fmt: skip
    for _, _, block in movable:
        allocator.release(block)
    allocator.compact()
    moved = 0
    for at, i, block in sorted(movable, key=lambda m: -m[2].offset):
        new = allocator.acquire_nowait(block.size, "long")
        long.discard(block.offset)
        long.add(new.offset)
        dying[at][i] = (new, dying[at][i][1])
        moved += block.size if new.offset != block.offset else 0
    return moved


def replay(
    strategy: str,
    events: list[Event],
    *,
    defrag: float | None = None,
    every: int = 1000,
    factory: Callable[[int], Strategy] | None = None,
    step: int = 0,
    boundary: int = 2,
) -> dict[str, float]:
    """Replay ``events``; with ``defrag``, compact every ``every`` allocations above that.

    With ``step``, a batch boundary every ``boundary`` allocations runs one step of
    incremental compaction of at most ``step`` bytes (``Strategy.shift``, what the
    memory manager runs after every batch with ``memory.compact_step``) over the
    long-lived blocks.

    ``factory`` builds the allocator instead of ``strategy``'s (the placement variants of
    ``bench_memory_placement``).
    """
    allocator: Strategy = (factory or allocator_factory(strategy))(ARENA)
    dying: dict[int, list[tuple[Block, int]]] = {}  # when -> (block, bytes asked)
    long: set[int] = set()
    samples: list[float] = []
    used: list[float] = []
    holes: list[float] = []
    waste: list[float] = []
    asked = 0  # bytes asked by the live blocks (what they hold beyond it is internal waste)
    failed = runs = moved = steps = 0
    pauses: list[float] = []
    warmup = len(events) // 10
    for i, event in enumerate(events):
        for block, nbytes in dying.pop(i, ()):
            allocator.release(block)
            long.discard(block.offset)
            asked -= nbytes
        try:
            block = allocator.acquire_nowait(event.size, event.lifetime)
        except OutOfMemory:
            failed += 1
        else:
            dying.setdefault(i + event.life, []).append((block, event.size))
            asked += event.size
            if event.lifetime == "long":
                long.add(block.offset)
        if step and i % boundary == 0:
            where = {b.offset: (at, j) for at, blocks in dying.items()
                     for j, (b, _) in enumerate(blocks) if b.offset in long}  # fmt: skip
            t0 = time.perf_counter()
            shifted = allocator.shift([dying[at][j][0] for at, j in where.values()], step)
            pauses.append(time.perf_counter() - t0)
            steps += 1
            for old, new in shifted:
                at, j = where.pop(old.offset)
                dying[at][j] = (new, dying[at][j][1])
                long.discard(old.offset)
                long.add(new.offset)
                moved += old.size
        checking = defrag is not None and i % every == 0
        if checking and allocator.statistics().fragmentation > (defrag or 0.0):
            runs += 1
            moved += compact(allocator, dying, long)
        if i >= warmup and i % 100 == 0:
            stats = allocator.statistics()
            samples.append(stats.fragmentation)
            used.append(stats.in_use_bytes / stats.reserved_bytes)
            holes.append((stats.free_bytes - stats.largest_free) / stats.reserved_bytes)
            waste.append((stats.in_use_bytes - asked) / stats.in_use_bytes)
    frag = np.asarray(samples)
    return {
        "fragmentation_mean": float(frag.mean()),
        "fragmentation_p95": float(np.percentile(frag, 95)),
        "holes_of_arena_mean": float(np.mean(holes)),
        "internal_waste_mean": float(np.mean(waste)),
        "in_use_mean": float(np.mean(used)),
        "failed": failed,
        "defrag_runs": runs,
        "moved_mib_per_run": moved / MiB / runs if runs else 0.0,
        "moved_mib_total": moved / MiB,
        "steps": steps,
        "moved_kib_per_allocation": moved / 1024 / len(events),
        "step_bookkeeping_us_p50": float(np.percentile(pauses, 50)) * 1e6 if pauses else 0.0,
        "step_bookkeeping_us_p99": float(np.percentile(pauses, 99)) * 1e6 if pauses else 0.0,
    }


def allocation_cost(strategy: str, size: int, repeats: int) -> tuple[float, float]:
    """p50 and p99 in µs of acquire + release of ``size`` with a few hundred blocks live."""
    allocator: Strategy = allocator_factory(strategy)(1024 * MiB)
    rng = random.Random(1)
    background = []
    for _ in range(300):
        try:
            background.append(allocator.acquire_nowait(rng.randint(1, 256) * 1024))
        except OutOfMemory:
            break
    for block in background[::3]:
        allocator.release(block)
    times = np.empty(repeats)
    clock = time.perf_counter_ns
    for r in range(repeats):
        t0 = clock()
        block = allocator.acquire_nowait(size)
        allocator.release(block)
        times[r] = clock() - t0
    return float(np.percentile(times, 50)) / 1000, float(np.percentile(times, 99)) / 1000


def numpy_cost(size: int, repeats: int) -> tuple[float, float]:
    """p50 and p99 in µs of np.empty(size) and a write to each of its pages."""
    times = np.empty(repeats)
    clock = time.perf_counter_ns
    for r in range(repeats):
        t0 = clock()
        array = np.empty(size, np.uint8)
        array[::4096] = 1
        times[r] = clock() - t0
        del array
    return float(np.percentile(times, 50)) / 1000, float(np.percentile(times, 99)) / 1000


def defrag_pause(strategy: str, movable_mib: int) -> dict[str, float]:
    """Fragment a 512 MiB arena with parked blocks, defragment once: bytes moved, pause."""
    arena = Arena(512 * MiB, allocator=allocator_factory(strategy), strategy=strategy)
    try:
        size = 2 * MiB
        held: list[Tensors] = []
        for index in range(2 * movable_mib // 2):
            lease = Lease(arena)
            try:
                block = lease.acquire_nowait(size)
            except OutOfMemory:
                lease.release()
                break
            view = np.ndarray((size,), np.uint8, arena.buffer, block.offset)
            view[:] = index % 251
            tensors = Tensors({"x": TensorRef(view, block.offset)}, (lease,))
            tensors.park()
            held.append(tensors)
        for tensors in held[1::2]:  # every other one goes: holes between parked blocks
            tensors.release()
        report = arena.defragment("bench")
        for tensors in held[::2]:
            tensors.release()
        return {
            "bytes_moved": report.bytes_moved,
            "pause_ms": report.pause_s * 1000,
            "before": report.fragmentation_before,
            "after": report.fragmentation_after,
        }
    finally:
        arena.close()


def shift_pauses(movable_mib: int, step: int) -> dict[str, float]:
    """The same fragmented 512 MiB arena as :func:`defrag_pause` (fragmentation_aware),
    compacted by ``Arena.shift(step)`` steps until nothing moves: steps, pause per step."""
    arena = Arena(
        512 * MiB,
        allocator=allocator_factory("fragmentation_aware"),
        strategy="fragmentation_aware",
    )
    try:
        size = 2 * MiB
        held: list[Tensors] = []
        for index in range(movable_mib):
            lease = Lease(arena)
            block = lease.acquire_nowait(size, "long")
            view = np.ndarray((size,), np.uint8, arena.buffer, block.offset)
            view[:] = index % 251
            tensors = Tensors({"x": TensorRef(view, block.offset)}, (lease,))
            tensors.park()
            held.append(tensors)
        for tensors in held[1::2]:
            tensors.release()
        before = arena.statistics().fragmentation
        pauses, moved = [], 0
        while (done := arena.shift(step)).bytes_moved:
            pauses.append(done.pause_s * 1000)
            moved += done.bytes_moved
        for tensors in held[::2]:
            tensors.release()
        return {
            "steps": len(pauses),
            "bytes_moved": moved,
            "pause_ms_p50": float(np.percentile(pauses, 50)) if pauses else 0.0,
            "pause_ms_max": max(pauses, default=0.0),
            "before": before,
            "after": arena.statistics().fragmentation,
        }
    finally:
        arena.close()


def under_load(seconds: float) -> dict[str, dict[str, float]]:
    """p50/p99 of the digits classifier (64 clients) with and without a defrag every 10 s.

    Each run serves ``sordino start`` with ``fragmentation_aware`` and a 64 MiB arena for
    ``seconds``; the defrag row sets ``--defrag-interval 10s`` and reports the runs and
    their pauses from ``GET /v2/sordino/memory``.
    """
    import urllib.request

    from bench.common import closed_loop, json_request, sordino_server

    pixels = np.random.default_rng(3).integers(0, 17, (1, 64)).astype(np.float32)
    payload = json_request("pixels", pixels)
    rows: dict[str, dict[str, float]] = {}
    for label, interval in (("no defrag", "0"), ("defrag every 10 s", "10s")):
        flags = ["--builtin", "--memory-strategy", "fragmentation_aware", "--pool-size", "64MB",
                 "--defrag-interval", interval]  # fmt: skip
        with sordino_server(flags) as ends:
            url = f"{ends.http}/v2/models/digits-classifier/infer"
            headers = {"Content-Type": "application/json"}
            asyncio.run(closed_loop(url, [payload] * 500, 16, headers))  # warm up
            count = int(seconds * 2500)
            latencies, wall = asyncio.run(closed_loop(url, [payload] * count, 64, headers))
            with urllib.request.urlopen(f"{ends.http}/v2/sordino/memory") as answer:
                status = json.loads(answer.read())
        last = status["last_defrag"] or {}
        ms = np.asarray(latencies) * 1000
        rows[label] = {
            "requests": len(latencies),
            "seconds": wall,
            "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)),
            "defrag_runs": status["defrag_runs"],
            "pause_total_ms": status["defrag_pause_s"] * 1000,
            "last_moved_bytes": last.get("bytes_moved", 0),
        }
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocations", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--load-seconds",
        type=float,
        default=0.0,
        help="also measure p99 under load with and without a defrag every 10 s (N s each)",
    )
    parser.add_argument(
        "--defrag-every", type=int, default=1000, help="check for defrag every N allocations"
    )
    parser.add_argument(
        "--threshold", type=float, default=0.05, help="defrag above this fragmentation"
    )
    parser.add_argument(
        "--step",
        type=float,
        default=2.0,
        help="incremental compaction: MiB moved at most per batch boundary (memory.compact_step)",
    )
    args = parser.parse_args()
    results: dict[str, object] = {}

    events = drift_trace(args.allocations, args.seed)
    table = Table(
        title=f"drift trace: {len(events)} allocations on a 256 MiB arena "
        f"(defrag checked every {args.defrag_every})"
    )
    columns = ("strategy", "defrag", "fragmentation mean", "p95", "holes / arena",
               "internal waste", "in use", "failed", "runs (steps)",
               "moved/run (/alloc)", "moved total")  # fmt: skip
    for column in columns:
        table.add_column(column, justify="right")
    drift = {}
    step = int(args.step * MiB)
    modes: list[tuple[str, float | None, int, int]] = [
        ("never", None, 0, 1),
        (f"> {args.threshold:.0%}", args.threshold, 0, 1),
        (f"steps <= {args.step:g} MiB, every allocation", None, step, 1),
        (f"steps <= {args.step:g} MiB, every 2nd", None, step, 2),
    ]
    for strategy in STRATEGIES:
        for label, defrag, budget, boundary in modes:
            row = replay(
                strategy, events, defrag=defrag, every=args.defrag_every, step=budget,
                boundary=boundary,
            )  # fmt: skip
            key = "defrag" if defrag is not None else f"steps/{boundary}" if budget else "none"
            drift[f"{strategy}/{key}"] = row
            if budget:
                row["moved_mib_per_run"] = row["moved_kib_per_allocation"] / 1024
                row["defrag_runs"] = row["steps"]
            table.add_row(
                strategy,
                label,
                f"{row['fragmentation_mean']:.1%}",
                f"{row['fragmentation_p95']:.1%}",
                f"{row['holes_of_arena_mean']:.1%}",
                f"{row['internal_waste_mean']:.2%}",
                f"{row['in_use_mean']:.0%}",
                str(row["failed"]),
                str(row["defrag_runs"]),
                f"{row['moved_mib_per_run']:.0f} MiB",
                f"{row['moved_mib_total'] / 1024:.1f} GiB",
            )
    console.print(table)
    results["drift"] = drift

    table = Table(title="acquire + release, µs (p50 / p99)")
    table.add_column("size")
    for name in (*STRATEGIES, "np.empty + first touch"):
        table.add_column(name, justify="right")
    cost: dict[str, dict[str, tuple[float, float]]] = {}
    for label, size, repeats in (
        ("4 KiB", 4096, 20000),
        ("1 MiB", MiB, 20000),
        ("64 MiB", 64 * MiB, 300),
    ):
        cells = {s: allocation_cost(s, size, max(repeats, 2000)) for s in STRATEGIES}
        cells["numpy"] = numpy_cost(size, repeats)
        cost[label] = cells
        table.add_row(label, *(f"{p50:.2f} / {p99:.2f}" for p50, p99 in cells.values()))
    console.print(table)
    results["allocation_us"] = cost

    table = Table(title="one defragmentation of a fragmented 512 MiB arena (parked 2 MiB blocks)")
    for column in ("strategy", "movable", "moved", "pause", "fragmentation"):
        table.add_column(column, justify="right")
    pauses = {}
    for strategy in STRATEGIES:
        for movable in (8, 32, 128):
            row = defrag_pause(strategy, movable)
            pauses[f"{strategy}/{movable}"] = row
            table.add_row(
                strategy,
                f"{movable} MiB",
                f"{row['bytes_moved'] / MiB:.0f} MiB",
                f"{row['pause_ms']:.1f} ms",
                f"{row['before']:.0%} -> {row['after']:.0%}",
            )
    console.print(table)
    results["defrag"] = pauses

    table = Table(
        title=f"the same arena (fragmentation_aware) compacted by steps <= {args.step:g} MiB"
    )
    for column in ("movable", "steps", "moved", "pause per step p50 / max", "fragmentation"):
        table.add_column(column, justify="right")
    stepped = {}
    for movable in (8, 32, 128):
        row = shift_pauses(movable, step)
        stepped[str(movable)] = row
        table.add_row(
            f"{movable} MiB",
            str(row["steps"]),
            f"{row['bytes_moved'] / MiB:.0f} MiB",
            f"{row['pause_ms_p50']:.2f} / {row['pause_ms_max']:.2f} ms",
            f"{row['before']:.0%} -> {row['after']:.0%}",
        )
    console.print(table)
    results["compaction_steps"] = stepped
    if args.load_seconds > 0:
        table = Table(title="digits-classifier, 64 clients: with and without a defrag every 10 s")
        for column in ("run", "requests", "req/s", "p50 ms", "p99 ms", "defrag runs", "pause"):
            table.add_column(column, justify="right")
        load = under_load(args.load_seconds)
        for label, row in load.items():
            table.add_row(
                label,
                str(row["requests"]),
                f"{row['requests'] / row['seconds']:.0f}",
                f"{row['p50_ms']:.1f}",
                f"{row['p99_ms']:.1f}",
                str(row["defrag_runs"]),
                f"{row['pause_total_ms']:.2f} ms",
            )
        console.print(table)
        results["under_load"] = load
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "memory.json"
    out.write_text(json.dumps(results, indent=2))
    console.print(f"results in {out}")


if __name__ == "__main__":
    main()
