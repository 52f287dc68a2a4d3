"""Issue 16: what one gRPC call costs a server, per gRPC server implementation.

    python -m bench.bench_grpc_servers [--calls 6000] [--rounds 2]

Each variant serves ``ModelInfer`` with a trivial handler (parse the request, one loop
turn, a prebuilt response) in its own process; a lean grpc.aio client in this process
sends a closed loop at 64 in flight. Printed per variant, rounds interleaved: req/s and
CPU ms per call of the server process and of the client. The variants: grpc.aio on
asyncio's loop and on uvloop (sordino's), with and without the options sordino's
server sets; the synchronous grpcio server whose pool threads hand each call to an
event loop (``asyncio.run_coroutine_threadsafe``) with 8 and 64 threads; grpclib (pure
Python HTTP/2) on uvloop, when it is installed (``pip install grpclib``; not a sordino
dependency).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import socket
import subprocess
import sys
import threading
import time
from typing import Any

import numpy as np
import psutil

from sordino.protocol.pb import kserve_v2_pb2 as pb

PORT = 0  # set by --port: each server gets a free port
METHOD = "/inference.GRPCInferenceService/ModelInfer"
SORDINO_OPTIONS = [
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", -1),
    ("grpc.so_reuseport", 0),
    ("grpc.server_handshake_timeout_ms", 10000),
]
VARIANTS = ["aio", "aio-uvloop", "aio-uvloop-sordino-options", "sync-8", "sync-64", "grpclib"]


def _response() -> bytes:
    response = pb.ModelInferResponse(model_name="w1")
    response.outputs.add(name="y", datatype="FP32", shape=[1, 16])
    response.raw_output_contents.append(np.zeros(16, np.float32).tobytes())
    return response.SerializeToString()


RESPONSE = _response()


async def _work(raw: bytes) -> bytes:
    pb.ModelInferRequest.FromString(raw)
    await asyncio.sleep(0)
    return RESPONSE


def _serve_aio(uvloop_: bool, options: list[tuple[str, Any]]) -> None:
    import grpc

    async def handler(raw: bytes, context: Any) -> bytes:
        return await _work(raw)

    async def main() -> None:
        server = grpc.aio.server(options=options)
        method = grpc.unary_unary_rpc_method_handler(handler)
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(METHOD.split("/")[1], {"ModelInfer": method}),)
        )
        server.add_insecure_port(f"127.0.0.1:{PORT}")
        await server.start()
        await server.wait_for_termination()

    if uvloop_:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def _serve_sync(threads: int) -> None:
    import grpc

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    def handler(raw: bytes, context: Any) -> bytes:
        return asyncio.run_coroutine_threadsafe(_work(raw), loop).result()

    server = grpc.server(concurrent.futures.ThreadPoolExecutor(threads))
    method = grpc.unary_unary_rpc_method_handler(handler)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(METHOD.split("/")[1], {"ModelInfer": method}),)
    )
    server.add_insecure_port(f"127.0.0.1:{PORT}")
    server.start()
    server.wait_for_termination()


def _serve_grpclib() -> None:
    import uvloop
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server

    class RawCodec:  # bytes in, bytes out: the handler parses, as sordino's does
        __content_type__ = "application/grpc"
        __content_subtype__ = "proto"

        def encode(self, message: Any, message_type: Any) -> bytes:
            return bytes(message)

        def decode(self, data: bytes, message_type: Any) -> bytes:
            return data

    class Service:
        def __mapping__(self) -> dict[str, Handler]:
            async def infer(stream: Any) -> None:
                await stream.send_message(await _work(await stream.recv_message()))

            return {METHOD: Handler(infer, Cardinality.UNARY_UNARY, None, None)}

    async def main() -> None:
        server = Server([Service()], codec=RawCodec())  # type: ignore[arg-type]
        await server.start("127.0.0.1", PORT)
        await server.wait_closed()

    uvloop.run(main())


def serve(variant: str) -> None:
    if variant == "aio":
        _serve_aio(False, [])
    elif variant == "aio-uvloop":
        _serve_aio(True, [])
    elif variant == "aio-uvloop-sordino-options":
        _serve_aio(True, SORDINO_OPTIONS)
    elif variant.startswith("sync-"):
        _serve_sync(int(variant.removeprefix("sync-")))
    elif variant == "grpclib":
        _serve_grpclib()


async def closed_loop(calls: int, concurrency: int = 64) -> float:
    import grpc

    request = pb.ModelInferRequest(model_name="w1")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 256])
    request.raw_input_contents.append(np.zeros(256, np.float32).tobytes())
    body = request.SerializeToString()
    left = calls
    async with grpc.aio.insecure_channel(f"127.0.0.1:{PORT}") as channel:
        infer = channel.unary_unary(METHOD, response_deserializer=pb.ModelInferResponse.FromString)
        await channel.channel_ready()

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                await infer(body)

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return time.perf_counter() - started


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=6000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--serve", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    global PORT
    if args.serve:
        PORT = args.port
        serve(args.serve)
        return
    variants = list(VARIANTS)
    try:
        import grpclib  # noqa: F401
    except ImportError:
        variants.remove("grpclib")
        print("grpclib is not installed: its row is skipped")
    me = psutil.Process()
    for round_ in range(args.rounds):
        for variant in variants:
            PORT = free_port()
            server = subprocess.Popen([sys.executable, "-m", "bench.bench_grpc_servers",
                                       "--serve", variant, "--port", str(PORT)])  # fmt: skip
            try:
                asyncio.run(asyncio.wait_for(closed_loop(300), 30))  # warm-up, and up
                process = psutil.Process(server.pid)
                s0, c0 = sum(process.cpu_times()[:2]), sum(me.cpu_times()[:2])
                seconds = asyncio.run(asyncio.wait_for(closed_loop(args.calls), 120))
                s1, c1 = sum(process.cpu_times()[:2]), sum(me.cpu_times()[:2])
            finally:
                server.kill()
                server.wait()
            print(
                f"round {round_ + 1}  {variant:28s} {args.calls / seconds:7,.0f} calls/s  "
                f"server {1000 * (s1 - s0) / args.calls:.3f} ms/call  "
                f"client {1000 * (c1 - c0) / args.calls:.3f} ms/call",
                flush=True,
            )


if __name__ == "__main__":
    main()
