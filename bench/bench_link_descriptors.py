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
output. Each cell is the median of ``--repeat`` runs, µs a request for each end (the
front end: its encode, send, read and decode; the engine: its read, decode, encode,
send and release), the two ways interleaved. ``RELEASE`` goes once every
``--release-every`` requests (the server sends one per event-loop turn: at 64 in flight
it carries several). The server sends tensors of ``link_arena.INLINE_MAX`` bytes or
less as bytes whatever the grant, a rule lifted here so that both ways are timed at
every size (the figures it was set from).
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
from sordino.protocol.encode import encode_infer_response
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


class _Ends:
    """CPU seconds spent by each end, added up part by part (both run in this process)."""

    def __init__(self) -> None:
        self.front = self.engine = 0.0
        self._at = time.process_time()

    def start(self) -> None:
        self._at = time.process_time()

    def front_did(self) -> None:
        now = time.process_time()
        self.front += now - self._at
        self._at = now

    def engine_did(self) -> None:
        now = time.process_time()
        self.engine += now - self._at
        self._at = now

    def per_request(self, requests: int) -> tuple[float, float]:
        """(front end, engine) µs a request."""
        return self.front * 1e6 / requests, self.engine * 1e6 / requests


def _inline_max(limit: int) -> None:
    """Set the size up to which tensors go as bytes (both modules read it)."""
    link_arena.INLINE_MAX = limit
    link_tensors.INLINE_MAX = limit  # type: ignore[attr-defined]


def inputs(shape: tuple[int, ...], placed: bool, requests: int) -> tuple[float, float]:
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

    ends = _Ends()

    def one() -> None:
        ends.start()
        parts, _ = link_tensors.encode_infer(1, request, 0.0, space=space)
        front.sendall(b"".join(parts))
        ends.front_did()
        decoded = link_tensors.decode_infer(_receive(engine, reader), grant)
        decoded.request.release()
        ends.engine_did()

    try:
        for _ in range(requests):
            one()
        return ends.per_request(requests)
    finally:
        front.close()
        engine.close()
        arena.close()


def outputs(
    shape: tuple[int, ...], placed: bool, requests: int, every: int = 1
) -> tuple[float, float]:
    arena = Arena(64 << 20)
    engine, front = _pair()
    reader = FrameReader()
    view = ArenaView()
    row = np.random.default_rng(0).random((1, *shape), dtype=np.float32)
    request = InferRequest("m", {}, parameters={"binary_data_output": True})
    where = arena if placed else None
    back_reader = FrameReader()
    ends = _Ends()
    held: dict[int, InferResponse] = {}
    done: list[int] = []

    def one(ident: int) -> None:
        builder = TensorsBuilder(arena)  # the worker's output, there either way: not timed
        builder.put("y", row)
        response = InferResponse("m", "1", builder.finish(), {"y": "FP32"})
        ends.start()
        parts, kept = link_tensors.encode_result_held(ident, response, False, where)
        if kept:
            held[ident] = response
        else:
            response.release()
        engine.sendall(b"".join(parts))
        ends.engine_did()
        _, back, _, is_held = link_tensors.decode_result(_receive(front, reader), view)
        encode_infer_response(back, request)
        if is_held:
            done.append(ident)
        if len(done) >= every:  # the RELEASE of a loop turn
            front.sendall(link_arena.encode_ids(link_arena.RELEASE, done))
            done.clear()
            ends.front_did()
            for released in link_arena.decode_ids(_receive(engine, back_reader)):
                held.pop(released).release()
            ends.engine_did()
        else:
            ends.front_did()

    try:
        for ident in range(requests):
            one(ident)
        return ends.per_request(requests)
    finally:
        engine.close()
        front.close()
        arena.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--release-every", type=int, default=8,
                        help="requests a RELEASE frame carries")  # fmt: skip
    args = parser.parse_args()
    rows: list[tuple[str, list[float]]] = []
    Run = Callable[[tuple[int, ...], bool, int], tuple[float, float]]
    cells: list[tuple[str, tuple[int, ...], Run]] = [
        (label, shape, inputs) for label, shape in SIZES.items()
    ]
    cells += [
        (label, shape, lambda s, p, n: outputs(s, p, n, args.release_every))
        for label, shape in OUTPUTS.items()
    ]
    limit = link_arena.INLINE_MAX
    _inline_max(0)
    for label, shape, run in cells:
        as_bytes, as_descriptor = [], []
        for _ in range(args.repeat):  # interleaved: the machine's load hits both alike
            as_bytes.append(run(shape, False, args.requests))
            as_descriptor.append(run(shape, True, args.requests))
        figures = [statistics.median(f[end] for f in way)
                   for way in (as_bytes, as_descriptor) for end in (0, 1)]  # fmt: skip
        rows.append((label, figures))
    _inline_max(limit)
    print("µs a request        as bytes: front  engine   descriptor: front  engine")
    for label, (bf, be, df, de) in rows:
        print(f"{label:<22} {bf:>12.1f} {be:>7.1f} {df:>19.1f} {de:>7.1f}")


if __name__ == "__main__":
    main()
