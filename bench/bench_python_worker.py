"""A Python-backend worker's own CPU a request (issue 29): the run loop, no server.

    python -m bench.bench_python_worker                      # W1 model.py, 32 requests a batch
    python -m bench.bench_python_worker --model echo         # a model that does nothing
    python -m bench.bench_python_worker --profile 25         # + cProfile, top 25 by own time
    python -m bench.bench_python_worker --server --spinning  # a real server under HTTP c64

The worker's run loop (``execution/worker_loop.serve``) runs in a thread of this process
over a real pipe and a real shared-memory arena, serving Triton's repository as
``bench_triton``'s "sordino python" row writes it (``bench/peers.py``: the W1 MLP run by
ONNX Runtime inside ``model.py``, 2 intra-op threads, not spinning here so that the
figures are the loop's own) or, with ``--model echo``, a ``model.py`` answering each
request its own input (the backend's cost alone). This thread plays the server: it
sends a :class:`Run` of ``--requests`` one-row requests (each with its facts, as the
engine sends them), answers any :class:`Alloc`, and reads the :class:`Done`, for
``--seconds``. It prints the loop thread's CPU (``time.thread_time``) a request and a
batch, with ``ONNX Runtime alone`` (``session.run`` on the same batch, in this thread)
for the W1 model, so that the backend's share is the difference.

``--server`` instead runs ``sordino start`` on that repository (``bench_triton``'s "sordino
python" settings), loads it with 64 HTTP requests in flight for ``--seconds`` a round,
and splits the worker process's CPU a request by thread: its main thread (the run loop,
``execute`` and the calling thread of ONNX Runtime) and the others (ONNX Runtime's
intra-op thread, which busy-waits between batches with ``--spinning``; the heartbeat).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import os
import pstats
import statistics
import tempfile
import threading
import time
from multiprocessing import Pipe
from pathlib import Path

import numpy as np
import psutil

from bench import models, peer_load, peers
from sordino.backends.base import BackendOptions
from sordino.backends.python.backend import PythonBackend
from sordino.execution.messages import STOP, Alloc, Allocated, Done, FrameReader, Run, encode
from sordino.execution.worker_link import WorkerLink
from sordino.execution.worker_loop import Streams, serve
from sordino.execution.worker_main import MappedArena
from sordino.inference import RequestFacts
from sordino.memory import Arena, write_tensor
from sordino.memory.tensors import TensorHandle

ECHO_PY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]
            )
            for r in requests
        ]
"""

WIDTH = 256


def _repository(folder: Path, model: str, spinning: bool) -> Path:
    """Write the model's repository; return its ``model.py``."""
    w1 = models.mlp()
    peers.write_triton_repository(folder, [peers.Batching("w1", spinning=spinning)], w1)
    path = folder / "w1" / "1" / "model.py"
    if model == "echo":
        path.write_text(ECHO_PY)
    return path


def _onnx_alone(rows: int, seconds: float) -> float:
    """CPU seconds of ``session.run`` on a batch of ``rows``, in this thread."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = peers.ORT_THREADS
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(models.mlp()), options, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(0).standard_normal((rows, WIDTH)).astype(np.float32)
    count, started, cpu = 0, time.perf_counter(), time.thread_time()
    while time.perf_counter() - started < seconds:
        session.run(None, {"x": x})
        count += 1
    return (time.thread_time() - cpu) / count


def measure(args: argparse.Namespace) -> dict[str, float]:
    """Run the loop for ``args.seconds``; its thread's CPU a batch, and the batches run."""
    with tempfile.TemporaryDirectory() as scratch:
        model_py = _repository(Path(scratch), args.model, args.spinning)
        backend = PythonBackend(BackendOptions(name="w1", version="1"))
        backend.load(model_py)
        arena = Arena(64 << 20)
        mapped = MappedArena(arena.name)
        ours, theirs = Pipe()
        link = WorkerLink(theirs)
        streams = Streams(link)
        link.watch_cancels(streams.cancel)
        profiler = cProfile.Profile() if args.profile else None
        spent: list[float] = []

        def loop() -> None:
            cpu = time.thread_time()
            if profiler is not None:
                profiler.runcall(serve, link, backend, mapped, streams)
            else:
                serve(link, backend, mapped, streams)
            spent.append(time.thread_time() - cpu)

        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        n = args.requests
        x = np.random.default_rng(0).standard_normal((n, WIDTH)).astype(np.float32)
        block = arena.acquire_nowait(int(x.nbytes))
        handle = write_tensor(arena.buffer, block.offset, block.size, x)
        space = {"y": TensorHandle.space(arena.acquire_nowait(int(x.nbytes)))}
        facts = tuple(RequestFacts(id=str(i)) for i in range(n))
        fd, frames, batches = ours.fileno(), FrameReader(), 0
        started, process, own = time.perf_counter(), time.process_time(), time.thread_time()
        while time.perf_counter() - started < args.seconds:
            os.write(fd, encode(Run(batches + 1, {"x": handle}, space, None, rows=(1,) * n,
                                    requests=facts)))  # fmt: skip
            done = False
            while not done:
                for message in frames.feed(os.read(fd, 1 << 16)):
                    if isinstance(message, Alloc):
                        os.write(fd, encode(Allocated(message.batch_id, space)))
                    elif isinstance(message, Done):
                        done = True
                    else:
                        raise SystemExit(f"the batch failed: {message}")
            batches += 1
        os.write(fd, encode(STOP))
        thread.join(30)
        others = time.process_time() - process - (time.thread_time() - own)
        backend.unload()
        if mapped.segment is not None:
            mapped.segment.close()
        arena.close()
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.profile)
    return {"batch_s": spent[0] / batches, "process_s": others / batches}


def _threads(pid: int) -> dict[tuple[int, int], float]:
    """CPU seconds of each thread of ``pid``'s children, by (pid, thread id)."""
    found: dict[tuple[int, int], float] = {}
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            for thread in child.threads():
                found[(child.pid, thread.id)] = thread.user_time + thread.system_time
    return found


def serve_and_split(args: argparse.Namespace) -> dict[str, float]:
    """One round against a real server: the worker's CPU a request, main thread and rest."""
    from bench.bench_triton import _runner
    from bench.common import sordino_server

    with tempfile.TemporaryDirectory() as scratch:
        model_py = _repository(Path(scratch), args.model, args.spinning)
        settings = Path(scratch) / "runtime.yaml"
        settings.write_text(
            "scheduler:\n  mode: adaptive\n  slo_p99_ms: 100.0\n  strategies:\n"
            "    - {name: dynamic_batching, max_batch: 32, timeout_ms: 10}\n"
        )
        repository = str(model_py.parent.parent.parent)
        command = ["--no-builtin", "--config", str(settings), "--model-repository", repository]
        with sordino_server(command) as server, _runner() as runner:
            host = server.http.removeprefix("http://").rstrip("/")
            rows = np.random.default_rng(0).standard_normal((256, WIDTH)).astype(np.float32)
            requests = [peer_load.kserve_http_request(host, "w1", "x", r) for r in rows]
            runner.run(peer_load.http_closed_loop(server.http, requests, 64, 1.0))
            before = _threads(server.pid)
            answers = runner.run(
                peer_load.http_closed_loop(server.http, requests, 64, args.seconds)
            )
            after = _threads(server.pid)
    count = max(1, len(answers.latencies))
    spent = {key: after[key] - before.get(key, 0.0) for key in after}
    main = sum(cpu for (pid, tid), cpu in spent.items() if pid == tid)
    return {
        "rate": count / answers.seconds,
        "main": main / count,
        "others": (sum(spent.values()) - main) / count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=("w1", "echo"), default="w1")
    parser.add_argument("--requests", type=int, default=32, help="one-row requests a batch")
    parser.add_argument("--seconds", type=float, default=3.0, help="a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--spinning",
        action="store_true",
        help="let model.py's ONNX Runtime threads spin (bench_triton's default)",
    )
    parser.add_argument("--profile", type=int, default=0, help="cProfile rows to print (0: off)")
    parser.add_argument("--server", action="store_true", help="a real server under HTTP c64")
    args = parser.parse_args()
    if args.server:
        split = [serve_and_split(args) for _ in range(args.rounds)]
        rate = statistics.median(r["rate"] for r in split)
        main_ms = statistics.median(r["main"] for r in split) * 1e3
        others_ms = statistics.median(r["others"] for r in split) * 1e3
        spinning = "spinning" if args.spinning else "not spinning"
        print(f"{args.model} served at c64 (ONNX Runtime {spinning}), median of {args.rounds}:")
        print(f"  {rate:,.0f} req/s; worker CPU a request: main thread {main_ms:.4f} ms, "
              f"other threads {others_ms:.4f} ms, all {main_ms + others_ms:.4f} ms")  # fmt: skip
        return
    rounds = [measure(args) for _ in range(args.rounds)]
    batch = statistics.median(r["batch_s"] for r in rounds)
    process = statistics.median(r["process_s"] for r in rounds)
    n = args.requests
    print(f"{args.model}, {n} requests a batch, median of {args.rounds} rounds:")
    print(f"  loop thread CPU {batch * 1e3:.3f} ms a batch, {batch / n * 1e3:.4f} ms a request")
    print(f"  every thread but the harness' {process * 1e3:.3f} ms a batch, "
          f"{process / n * 1e3:.4f} ms a request")  # fmt: skip
    if args.model == "w1":
        alone = _onnx_alone(n, args.seconds)
        print(f"  ONNX Runtime alone {alone * 1e3:.3f} ms a batch, "
              f"{alone / n * 1e3:.4f} ms a request; the rest "
              f"{(batch - alone) / n * 1e3:.4f} ms a request")  # fmt: skip


if __name__ == "__main__":
    main()
