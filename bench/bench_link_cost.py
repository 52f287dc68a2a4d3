"""The engine's CPU a request that a front-end process forwarded (the CPU model's e_fwd),
measured on the engine's loop thread alone (W1-sized digits classifier, 64 in flight).

    python -m bench.bench_link_cost                                 # this checkout, 3 runs
    python -m bench.bench_link_cost --base /work/main --pairs 3     # main and this, alternated
    python -m bench.bench_link_cost --profile 30                    # + a cProfile ranking
    python -m bench.bench_link_cost --grpc                          # GRPC_INFER frames

A real server in a child process (``sordino.testing.serve_in_thread``, the built-in digits
classifier, default settings) with an :class:`EngineLink` on its loop, and a feeder
process that speaks the link exactly as a front end does: ``FrontendLink.open`` (HELLO),
a JSON body decoded by ``fast_infer.decode_body``, ``FrontendLink.call_decoded`` (one
``INFER`` frame), the ``RESULT`` decoded back — 64 requests in flight, each sent again as
soon as its answer arrives. No HTTP anywhere: the figure is the engine loop thread's own
CPU (its ``pthread_getcpuclockid`` clock, read from another thread) over the requests
answered in a round — the link's read, decode, the service, the scheduler, staging, the
worker pipe, telemetry, the result's frame and its write — the median of ``--rounds``
rounds of ``--seconds`` after one unmeasured. With ``--grpc`` the feeder sends each as
the gRPC front end does (``server/grpc_frontend.py``): the ``ModelInferRequest``'s
bytes parsed and decoded by ``grpc_codec.decode_infer_request``, then
``FrontendLink.call_grpc`` (one ``GRPC_INFER`` frame). The feeder's and the worker's CPU are not
counted. ``bench.bench_engine_cost`` measures the same engine without the link (the
service called on its loop), so the difference of the two is the link's own path.

``--profile N`` adds one round under cProfile on the loop thread and prints its top N
functions by own time (and the Python calls a request, a figure the machine's noise
does not move): calls, own and cumulative µs a request *under the profiler*,
which inflates small Python functions (read it as a ranking), in wall time (a system
call's time includes the thread's waits for a core on a busy machine). With
``--base DIR`` the runs alternate with DIR's ``src/`` (base, this, base, this …) so both share the
machine's noise. Results go to ``bench/results/link_cost.json`` (``link_cost_grpc.json``
with ``--grpc``).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.common import (
    alternated,
    alternation_arguments,
    child_run,
    console,
    report_alternation,
    save,
)

FEEDER = r"""
import asyncio, sys, time
import numpy as np
import orjson
from sordino.protocol.grpc_codec import decode_infer_request, parse_message
from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.server.fast_infer import decode_body
from sordino.server.frontend_link import FrontendLink

rows = np.random.default_rng(0).integers(0, 17, size=(256, 64)).astype(np.float32)
bodies = [orjson.dumps({"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                                     "data": row.tolist()}]}) for row in rows]
grpc_mode = sys.argv[2] == "grpc"

def message(row):
    m = pb.ModelInferRequest(model_name="digits-classifier")
    m.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    m.raw_input_contents.append(row.tobytes())
    return m.SerializeToString()

messages = [message(row) for row in rows]

def send(link, i):
    if grpc_mode:  # as server/grpc_frontend.py's model_infer
        parsed = parse_message(pb.ModelInferRequest, messages[i % 256])
        return link.call_grpc(decode_infer_request(parsed), parsed.ByteSize())[1]
    request = decode_body(bodies[i % 256], "digits-classifier", None, None, {},
                          client="127.0.0.1", received_at=time.monotonic())
    return link.call_decoded(request, 2e-6)[1]

async def main():
    link = await FrontendLink.open(sys.argv[1])
    loop = asyncio.get_running_loop()
    count = 0

    async def client(i):
        nonlocal count
        while True:
            await link.writable()
            reply = await send(link, i)
            if not isinstance(reply, tuple):
                sys.exit(f"the engine answered {reply}")
            count += 1
            i += 64

    done = loop.create_future()

    def on_line():
        if not sys.stdin.readline():
            loop.remove_reader(sys.stdin.fileno())
            done.set_result(None)
        else:
            print(count, flush=True)

    loop.add_reader(sys.stdin.fileno(), on_line)
    tasks = [loop.create_task(client(i)) for i in range(64)]
    print("ready", flush=True)
    await done
    for task in tasks:
        task.cancel()

asyncio.run(main())
"""

ENGINE = r"""
import asyncio, cProfile, json, pstats, subprocess, sys, threading, time
from sordino.config import load_config
from sordino.server.engine_link import EngineLink
from sordino.testing import serve_in_thread

rounds, seconds, top = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
feeder_code, mode = sys.argv[4], sys.argv[5]
runtimes = []
with serve_in_thread(load_config(None, {}), prepare=runtimes.append) as server:
    loop = server.loop

    async def open_link():
        link = EngineLink(runtimes[0], lambda sock, read: sock.close())
        await link.start()
        return link, threading.get_ident()

    def on_loop(call):
        async def run():
            return call()
        return asyncio.run_coroutine_threadsafe(run(), loop).result()

    link, ident = asyncio.run_coroutine_threadsafe(open_link(), loop).result()
    clock = time.pthread_getcpuclockid(ident)
    feeder = subprocess.Popen([sys.executable, "-c", feeder_code, link.link_path, mode],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert feeder.stdout.readline().strip() == "ready"

    def mark():
        feeder.stdin.write("mark\n")
        feeder.stdin.flush()
        count = int(feeder.stdout.readline())
        return count, time.clock_gettime(clock)

    def runs():  # the model's (requests, batches) so far
        stats = on_loop(lambda: server.runtime.service.triton_statistics("digits-classifier"))
        model = stats["model_stats"][0]
        return model["inference_count"], model["execution_count"]

    time.sleep(seconds)  # warm-up, not measured
    cells = []
    for _ in range(rounds):
        r0, b0 = runs()
        n0, c0 = mark()
        time.sleep(seconds)
        n1, c1 = mark()
        r1, b1 = runs()
        cells.append(((c1 - c0) / (n1 - n0) * 1e6, (n1 - n0) / seconds, (r1 - r0) / (b1 - b0)))
    ranking, calls = [], 0.0
    if top:
        profiler = cProfile.Profile()
        n0, _ = mark()
        on_loop(profiler.enable)
        time.sleep(seconds)
        on_loop(profiler.disable)
        n1, _ = mark()
        n = n1 - n0
        stats = pstats.Stats(profiler).stats
        calls = sum(v[1] for v in stats.values()) / (n1 - n0)
        rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
        for (path, line, name), (cc, nc, tt, ct, _) in rows:
            where = path.split("/src/")[-1] if "/src/" in path else path.rsplit("/", 1)[-1]
            ranking.append((f"{where}:{line}:{name}", nc / n, tt / n * 1e6, ct / n * 1e6))
    feeder.stdin.close()
    feeder.wait(10)
print(json.dumps({"us": [c[0] for c in cells], "rate": [c[1] for c in cells],
                  "batch": [c[2] for c in cells], "profile": ranking,
                  "calls": calls}))
"""


def one_run(src: Path, rounds: int, seconds: float, top: int, mode: str) -> dict[str, Any]:
    """One engine process on ``src``: its rounds' µs of loop CPU a forwarded request."""
    command = [sys.executable, "-c", ENGINE, str(rounds), str(seconds), str(top), FEEDER, mode]
    return child_run(command, src, timeout=600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    alternation_arguments(parser)
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="a profiled round in each run: its top N functions")  # fmt: skip
    parser.add_argument("--grpc", action="store_true",
                        help="GRPC_INFER frames, as the gRPC front end sends them")  # fmt: skip
    args = parser.parse_args()
    mode = "grpc" if args.grpc else "http"
    codes = alternated(args.base)
    runs: dict[str, list[float]] = {label: [] for label, _ in codes}
    profiles: dict[str, Any] = {}
    calls: dict[str, list[float]] = {}
    for pair in range(args.pairs):
        for label, src in codes:
            result = one_run(src, args.rounds, args.seconds, args.profile, mode)
            runs[label].append(result["median_us"])
            profiles[label] = result["profile"]
            if args.profile:
                calls.setdefault(label, []).append(result["calls"])
            rate = statistics.median(result["rate"])
            batch = statistics.median(result["batch"])
            console.print(f"[{pair + 1}/{args.pairs}] {label}: {result['median_us']:.1f} µs "
                          f"CPU a forwarded request on the loop ({rate:,.0f} req/s, "
                          f"{batch:.1f} requests a batch)")  # fmt: skip
    report: dict[str, Any] = {
        "benchmark": "link_cost", "frames": mode, "runs_us": runs, "profile": profiles
    }  # fmt: skip
    report_alternation(runs, report, "a request")
    for label, counts in calls.items():
        report[f"{label}_calls"] = counts
        listed = ", ".join(f"{c:.0f}" for c in counts)
        console.print(f"{label}: {statistics.median(counts):.0f} Python calls a request on the "
                      f"loop (profiled rounds: {listed})")  # fmt: skip
    for label, ranking in profiles.items():
        if ranking:
            console.print(f"{label}, last run's profile (µs a request under cProfile):")
            console.print(f"{'calls':>6} {'own':>6} {'cum':>7}  function")
            for where, calls, own, cum in ranking:
                console.print(f"{calls:6.2f} {own:6.1f} {cum:7.1f}  {where}", highlight=False)
    console.print(f"wrote {save('link_cost_grpc' if args.grpc else 'link_cost', report)}")


if __name__ == "__main__":
    main()
