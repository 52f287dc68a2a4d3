"""A second process for the load board's tests: ``python -m tests.server.board_process``.

Modes (the first argument):

- ``reader NAME``: attaches the board ``NAME`` and answers one JSON command a line on
  stdin (``header``, ``routes``, ``shed`` with ``target``, ``headers`` and optional
  ``rules``), one JSON answer a line on stdout, until ``quit`` or end of input;
- ``writer REGISTRY SECONDS``: creates a board, prints its name, then for ``SECONDS``
  writes records whose every figure is the same counter (a torn read would mix two),
  prints the number of writes, and closes the board at end of input;
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from sordino.records import QueueSettings
from sordino.server.board_shed import BoardShed
from sordino.server.load_board import MAX_LEVELS, LoadBoard, RouteLoad


def _route_dict(route: RouteLoad) -> dict[str, Any]:
    s = route.settings
    return {
        "name": route.name,
        "version": route.version,
        "default": route.default,
        "ready": route.ready,
        "eligible": route.eligible,
        "priority_levels": s.priority_levels,
        "default_priority": s.default_priority,
        "default_timeout_s": s.default_timeout_s,
        "waits": list(route.waits),
        "rows_ahead": list(route.rows_ahead),
        "json_values": route.json_values,
    }


async def _decide(shed: BoardShed, target: bytes, headers: list[tuple[bytes, bytes]]) -> Any:
    return shed.refusal(target, headers)


def reader(name: str) -> None:
    board = LoadBoard.attach(name)
    loop = asyncio.new_event_loop()
    sheds: dict[bytes, BoardShed] = {}
    try:
        for line in sys.stdin:
            command = orjson.loads(line)
            op = command["op"]
            answer: Any = None
            if op == "quit":
                break
            if op == "header":
                header = board.header()
                answer = None if header is None else {
                    "share": header.share, "top_share": header.top_share,
                    "pid": header.pid, "fresh": board.fresh(header),
                    "tenants_required": header.tenants_required, "stopping": header.stopping,
                    "overflow": header.overflow,
                }  # fmt: skip
            elif op == "routes":
                answer = [_route_dict(r) for r in board.routes()]
            elif op == "shed":
                rules = command.get("rules", {})
                key = orjson.dumps(rules)
                shed = sheds.get(key)
                if shed is None:
                    shed = sheds[key] = BoardShed(board, rules)
                headers = [(n.encode(), v.encode()) for n, v in command["headers"]]
                target = command["target"].encode()

                refusal = loop.run_until_complete(_decide(shed, target, headers))
                if refusal is not None:
                    status, body, response_headers = refusal
                    answer = [status, body.decode(), response_headers]
            sys.stdout.write(orjson.dumps(answer).decode() + "\n")
            sys.stdout.flush()
    finally:
        loop.close()
        board.close()


def writer(registry: str, seconds: float) -> None:
    board = LoadBoard.create(Path(registry), slots=4)
    print(board.name, flush=True)
    settings = QueueSettings(priority_levels=MAX_LEVELS, default_priority=2)
    end = time.monotonic() + seconds
    writes = 0
    while time.monotonic() < end:
        writes += 1
        k = float(writes)
        board.write_route(0, RouteLoad(
            "m", "1", True, True, True, settings, (k,) * MAX_LEVELS, (writes,) * MAX_LEVELS,
        ))  # fmt: skip
        board.write_header(
            share=k, top_share=k, last_lag_s=k, tenants_required=False, stopping=False,
            overflow=writes,
        )  # fmt: skip
    print(writes, flush=True)
    sys.stdin.read()
    board.close()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "reader":
        reader(sys.argv[2])
    elif mode == "writer":
        writer(sys.argv[2], float(sys.argv[3]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")
