"""What sordino's own code costs a front end for one forwarded gRPC ``ModelInfer``.

    python -m bench.bench_frontend_grpc_steps              # 20,000 calls a step, best of 3

A front end (``server/grpc_frontend.py``) parses a ``ModelInfer``, decodes it, stamps
it with the caller's address and credentials, frames it for the engine link
(``GRPC_INFER``), and encodes the engine's response. Each step is timed here alone,
on bench_frontends' request (W1: one FP32 row of 64, raw_input_contents) and a
response of one FP32 row of 10, in this process, without gRPC: the rest of a
forwarded call's CPU in the front end (``bench.bench_frontends --transport grpc``) is
grpc.aio's and gRPC core's (docs/benchmarks.md, "gRPC through the front ends").
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

import numpy as np

from bench.peer_load import kserve_grpc_request
from sordino.inference import InferResponse
from sordino.protocol.grpc_codec import (
    decode_infer_request,
    encode_infer_response,
    parse_message,
)
from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.server import link_tensors
from sordino.server.grpc import Caller
from sordino.server.grpc_guard import serialize


class _Context:
    """The two context calls the front end makes (as grpc.aio answers them)."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return (("user-agent", "grpc-python/1.85"),)

    def peer(self) -> str:
        return "ipv4:127.0.0.1:50500"


def steps() -> dict[str, Callable[[], Any]]:
    """The front end's steps for one call, each a callable."""
    rng = np.random.default_rng(0)
    raw = kserve_grpc_request("w1", "input", rng.random((1, 64), dtype=np.float32))
    message = parse_message(pb.ModelInferRequest, raw)
    request = decode_infer_request(message)
    response = InferResponse(
        model="w1",
        version="1",
        outputs={"output": rng.random((1, 10), dtype=np.float32)},
        output_datatypes={"output": "FP32"},
    )
    context = _Context()
    return {
        "parse (FromString)": lambda: parse_message(pb.ModelInferRequest, raw),
        "decode_infer_request": lambda: decode_infer_request(message),
        "Caller.of + stamp (metadata, peer)": lambda: Caller.of(context).stamp(request),
        "GRPC_INFER frame (encode_infer)": lambda: link_tensors.encode_infer(
            1, request, 0.0, kind=link_tensors.GRPC_INFER, room=len(raw)
        ),
        "encode_infer_response + serialize": lambda: serialize(
            encode_infer_response(response, request)
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000, help="calls a step a round")
    args = parser.parse_args()
    total = 0.0
    for label, step in steps().items():
        best = min(timeit.repeat(step, number=args.calls, repeat=3)) / args.calls * 1e6
        total += best
        print(f"{label:40s} {best:6.1f} µs")
    print(f"{'all of sordino own steps':40s} {total:6.1f} µs")


if __name__ == "__main__":
    main()
