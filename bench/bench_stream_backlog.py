"""A client that stops reading a decoupled model's stream: what does the server hold?

    python -m bench.bench_stream_backlog [--responses 3000] [--seconds 10]

Serves one decoupled Triton Python model (``flood``: on a thread of its own it sends
``N`` responses of 1 MiB, stopping once told the request is cancelled) unchanged on
``tritonserver`` (Triton 2.51 from the ``nvidia-pytriton`` 0.7.0 wheel,
``bench/.peers/triton``, as ``bench.triton_python_parity``) and on ``sordino start
--model-repository`` with its defaults (``server.max_stream_backlog`` 64 MiB). On each,
a gRPC ``ModelStreamInfer`` client (``tritonclient``) asks for ``--responses`` responses
and stops reading after the first: its callback blocks for ``--seconds`` while the
server's resident memory (the server and its children: Triton's stub, sordino's
workers) is sampled twice a second. Then it reads again, for up to 20 s, and counts what
it gets and how the request ended.

Prints a line a server and writes ``bench/results/stream_backlog.json``. Exit status 2
when a server could not be installed or started. Not a timing: the figure is memory.
"""

from __future__ import annotations

import argparse
import contextlib
import queue
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import tritonclient.grpc as grpcclient

from bench import peers
from bench.common import save, sordino_server

CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""

FLOOD = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            threading.Thread(target=self.send, args=(request, sender, n), daemon=True).start()
        return None

    def send(self, request, sender, n):
        block = np.ones(262144, np.float32)  # 1 MiB
        for _ in range(n):
            if request.is_cancelled():
                return
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", block)]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def _resident_mb(pid: int) -> float:
    """Resident memory of ``pid`` and its descendants, in MiB."""
    try:
        root = psutil.Process(pid)
        total = root.memory_info().rss
        for child in root.children(recursive=True):
            with contextlib.suppress(psutil.Error):  # it ended meanwhile
                total += child.memory_info().rss
    except psutil.Error:
        return float("nan")
    return total / (1 << 20)


def measure(grpc_url: str, pid: int, responses: int, seconds: float) -> dict[str, Any]:
    """One silent stream against the server at ``grpc_url`` (process ``pid``)."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    resume = threading.Event()
    stalled = [True]

    def callback(result: Any, error: Any) -> None:
        answers.put((result, error))
        if stalled[0]:
            stalled[0] = False
            resume.wait()  # the client's stream reader stops here

    client = grpcclient.InferenceServerClient(grpc_url)
    start_mb = _resident_mb(pid)
    client.start_stream(callback=callback)
    tensor = grpcclient.InferInput("N", [1], "INT32")
    tensor.set_data_from_numpy(np.array([responses], np.int32))
    client.async_stream_infer("flood", [tensor], enable_empty_final_response=True)
    peak = start_mb
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        time.sleep(0.5)
        peak = max(peak, _resident_mb(pid))
        print(f"  {time.monotonic() - ends + seconds:4.1f} s: {_resident_mb(pid):7.0f} MiB",
              end="\r", flush=True)  # fmt: skip
    print(" " * 40, end="\r")
    resume.set()
    got, ended = 0, "no end within 20 s"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            result, error = answers.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            break
        if error is not None:
            ended = f"error: {str(error)[:160]}"
            break
        got += 1
        if result.get_response().parameters["triton_final_response"].bool_param:
            ended = "final response"
            break
    client.stop_stream(cancel_requests=True)
    client.close()
    return {
        "resident_start_mib": round(start_mb),
        "resident_peak_mib": round(peak),
        "growth_mib": round(peak - start_mb),
        "responses_read": got,
        "ended": ended,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--responses", type=int, default=3000, help="1 MiB responses asked for")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the client stalls")
    args = parser.parse_args()
    results: dict[str, Any] = {"responses": args.responses, "seconds": args.seconds}
    with tempfile.TemporaryDirectory(prefix="bench-backlog-") as scratch:
        for side in ("triton", "sordino"):
            model = Path(scratch) / side / "flood"
            (model / "1").mkdir(parents=True)
            (model / "config.pbtxt").write_text(CONFIG)
            (model / "1" / "model.py").write_text(FLOOD)
        try:
            python = peers.ensure_venv("triton", peers.TRITON_PACKAGES,
                                       "import pytriton, onnxruntime, numpy")  # fmt: skip
            with peers.triton_on(python, Path(scratch) / "triton") as triton:
                assert triton.grpc is not None
                results["triton"] = measure(triton.grpc, triton.pid, args.responses, args.seconds)
            print("triton 2.51:", results["triton"])
            repository = str(Path(scratch) / "sordino")
            with sordino_server(["--model-repository", repository, "--no-builtin"]) as server:
                results["sordino"] = measure(server.grpc, server.pid, args.responses, args.seconds)
            print("sordino:    ", results["sordino"])
        except peers.PeerError as exc:
            print(f"cannot run: {exc}", file=sys.stderr)
            sys.exit(2)
    print(f"results in {save('stream_backlog', results)}")


if __name__ == "__main__":
    main()
