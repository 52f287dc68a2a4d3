"""Helpers for tests that hold a model mid-batch: a gate on its backend, queue statistics."""

from __future__ import annotations

import json
import threading
from typing import Any

from sordino.inference import Tensor
from sordino.records import SchedulerStatistics
from sordino.server.load_board import LoadBoard
from sordino.testing import RunningServer
from tests.waiting import wait_for

SIMPLE_BODY = json.dumps(
    {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}
            for n in ("INPUT0", "INPUT1")
        ]
    }
).encode()
"""A JSON ``infer`` body for the built-in ``simple`` model: one row of ones."""

SIMPLE_REQUEST = (
    f"POST /v2/models/simple/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    f"Content-Type: application/json\r\nContent-Length: {len(SIMPLE_BODY)}\r\n\r\n"
).encode() + SIMPLE_BODY
"""``SIMPLE_BODY`` as a whole raw HTTP/1.1 request (head and body), to send on a socket."""


def stats(server: RunningServer, name: str, version: str | None = None) -> SchedulerStatistics:
    return server.runtime.get(name, version).scheduler.statistics()


def published_backlog(server: RunningServer, model: str, rows: int) -> None:
    """Wait until ``rows`` rows of ``model`` are queued and the engine's load board (a
    server with front-end processes) shows them."""
    wait_for(lambda: stats(server, model).queue.depth == rows, f"{rows} rows queued")
    assert server.frontends is not None and server.frontends.spec.board is not None
    board = LoadBoard.attach(server.frontends.spec.board)
    try:
        wait_for(
            lambda: any(r.name == model and sum(r.rows_ahead) == rows for r in board.routes()),
            "the engine to publish the backlog",
        )
    finally:
        board.close()


class Gate:
    """Holds every batch of one model version inside its backend until released.

    ``rows`` records each batch that reached the backend, so a test can prove a
    cancelled request never ran.
    """

    def __init__(self, server: RunningServer, name: str, version: str | None = None) -> None:
        self.backend: Any = server.thread_backends(name, version)[0]
        self._original = self.backend.infer
        self.entered = threading.Event()
        self.released = threading.Event()
        self.rows: list[int] = []
        self.backend.infer = self._infer

    def _infer(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        self.rows.append(int(next(iter(batch.values())).shape[0]))
        self.entered.set()
        if not self.released.wait(60):
            raise RuntimeError("the test never released the gate")
        result: dict[str, Tensor] = self._original(batch)
        return result

    def release(self) -> None:
        """Let the held batch and every later one run (they are still recorded)."""
        self.released.set()

    def __enter__(self) -> Gate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.released.set()
        self.backend.infer = self._original


def frontend_pid(server: RunningServer) -> int:
    """The first front-end process of a server with ``server.frontends`` > 1."""
    assert server.frontends is not None
    return server.frontends.pids()[0]
