"""A local webhook receiver standing in for Slack or a webhook alert channel."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any


class Receiver:
    """Every JSON body POSTed to :attr:`url`, with the time ``now()`` gave at arrival
    (wall time unless a clock is given, e.g. a test's virtual one)."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        arrived = self.arrived = []  # type: list[tuple[float, dict[str, Any]]]

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                arrived.append((now(), json.loads(self.rfile.read(length))))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        self._server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/hook"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The bodies alone, in arrival order."""
        return [body for _, body in self.arrived]

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def receiving(now: Callable[[], float] = time.time) -> Iterator[Receiver]:
    """A :class:`Receiver` for the block, closed after it."""
    receiver = Receiver(now)
    try:
        yield receiver
    finally:
        receiver.close()
