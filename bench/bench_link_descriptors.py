"""Tensors across the engine link: as bytes in the frame, or as arena descriptors.

    python -m bench.bench_link_descriptors               # 2,000 requests a cell, 3 repeats
    python -m bench.bench_link_descriptors --requests 500 --repeat 1

What one request's tensors cost on the link alone, CPU time in this process (both ends
run here, over a real Unix socket pair): the front end's ``encode_infer`` (inline, or
laid into its grant), the send, the engine's read (``FrameReader``) and
``decode_infer``, and the request's release (a granted range freed, as ``FREED`` does);
then the way back: the engine's ``encode_result_held`` (bytes, or descriptors held in
the arena), the send, the front end's read and ``decode_result`` (read in place through
its read-only mapping) and the encoding of the answer (``encode_infer_response``,
binary), then the release (``RELEASE``). Row sizes: W1's input (256 FP32, 1 KiB) and
output (10 FP32), W2's input (3×64×64 FP32, 48 KiB) and output (10 FP32), and a 48 KiB
output. Each cell is the median of ``--repeat`` runs, µs a request, the two ways
interleaved; the server sends tensors of ``link_arena.INLINE_MAX`` bytes or less as
bytes whatever the grant, a rule lifted here so that both ways are timed at every size
(the figures it was set from).
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from collections.abc import Callable

import numpy as np

from sordino.inference import InferRequest, InferResponse
from sordino.memory import Arena, TensorsBuilder
from sordino.memory.grant import Grant, GrantSpace
from sordino.memory.peer_view import ArenaView
from sordino.protocol.codec import encode_infer_response
from sordino.server import link_arena, link_tensors
from sordino.server.link_frames import FrameReader

SIZES = {"w1 input 1 KiB": (256,), "input 4 KiB": (1024,), "input 16 KiB": (4096,),
         "w2 input 48 KiB": (3, 64, 64)}  # fmt: skip
OUTPUTS = {"w1/w2 output 40 B": (10,), "output 4 KiB": (1024,), "output 48 KiB": (3, 64, 64)}


def _pair() -> tuple[socket.socket, socket.socket]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for s in (a, b):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    return a, b


def _receive(sock: socket.socket, reader: FrameReader) -> bytes:
    while True:
        frames = reader.feed(sock.recv(1 << 20))
        for _, body in frames:
            return body


def _time(run: Callable[[], None], requests: int) -> float:
    started = time.process_time()
    for _ in range(requests):
        run()
    return (time.process_time() - started) * 1e6 / requests


def _inline_max(limit: int) -> None:
    """Set the size up to which tensors go as bytes (both modules read it)."""
    link_arena.INLINE_MAX = limit
    link_tensors.INLINE_MAX = limit  # type: ignore[attr-defined]


def inputs(shape: tuple[int, ...], placed: bool, requests: int) -> float:
    arena = Arena(64 << 20)
    front, engine = _pair()
    reader = FrameReader()
    grant, space = None, None
    if placed:  # FREED, as the front end takes it, straight back to its allocator
        grant = Grant(arena, 16 << 20, lambda offset: free(offset))
        space = GrantSpace(arena.name, grant.block.offset, grant.block.size)
        free = space.free
    row = np.random.default_rng(0).random((1, *shape), dtype=np.float32)
    request = InferRequest("m", {"x": row}, input_datatypes={"x": "FP32"})

    def one() -> None:
        parts, _ = link_tensors.encode_infer(1, request, 0.0, space=space)
        front.sendall(b"".join(parts))
        decoded = link_tensors.decode_infer(_receive(engine, reader), grant)
        decoded.request.release()

    try:
        return _time(one, requests)
    finally:
        front.close()
        engine.close()
        arena.close()


def outputs(shape: tuple[int, ...], placed: bool, requests: int) -> float:
    arena = Arena(64 << 20)
    engine, front = _pair()
    reader = FrameReader()
    view = ArenaView()
    row = np.random.default_rng(0).random((1, *shape), dtype=np.float32)
    request = InferRequest("m", {}, parameters={"binary_data_output": True})
    where = arena if placed else None
    back_reader = FrameReader()

    def one() -> None:
        builder = TensorsBuilder(arena)
        builder.put("y", row)
        response = InferResponse("m", "1", builder.finish(), {"y": "FP32"})
        parts, kept = link_tensors.encode_result_held(1, response, False, where)
        if not kept:
            response.release()
        engine.sendall(b"".join(parts))
        _, back, _, _ = link_tensors.decode_result(_receive(front, reader), view)
        encode_infer_response(back, request)
        if kept:  # the RELEASE, sent and taken as the engine takes it
            front.sendall(link_arena.encode_ids(link_arena.RELEASE, [1]))
            link_arena.decode_ids(_receive(engine, back_reader))
            response.release()

    try:
        return _time(one, requests)
    finally:
        engine.close()
        front.close()
        arena.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rows: list[tuple[str, float, float]] = []
    cells = [(label, shape, inputs) for label, shape in SIZES.items()]
    cells += [(label, shape, outputs) for label, shape in OUTPUTS.items()]
    limit = link_arena.INLINE_MAX
    _inline_max(0)
    for label, shape, run in cells:
        as_bytes, as_descriptor = [], []
        for _ in range(args.repeat):  # interleaved: the machine's load hits both alike
            as_bytes.append(run(shape, False, args.requests))
            as_descriptor.append(run(shape, True, args.requests))
        rows.append((label, statistics.median(as_bytes), statistics.median(as_descriptor)))
    _inline_max(limit)
    print(f"{'tensor':<22} {'as bytes µs':>12} {'descriptor µs':>14}")
    for label, b, d in rows:
        print(f"{label:<22} {b:>12.1f} {d:>14.1f}")


if __name__ == "__main__":
    main()
