"""A grpc.aio server that keeps several calls requested from gRPC core at once.

grpc.aio's accept loop (``AioServer._server_main_loop`` in grpcio's Cython) asks gRPC
core for the next call with one ``grpc_server_request_call`` and asks again only once
that one has come back through the completion queue, the poller thread and a turn of
the event loop, and the call's task has been made. Under many calls in flight the loop
is busy with other work most of the time, so new calls trickle in one per couple of
loop turns while the rest wait inside core, not in sordino's queue, and the batcher
sees 2–6 rows where HTTP hands it ~30 (docs/benchmarks.md, issue 30, gRPC).

:class:`AcceptAhead` overrides the one hook of that loop that is Python
(``_make_request_call_future``; grpcio 1.85 has it; other minors are not trusted): it keeps
``ahead`` requests for the generic handler outstanding in core, so every call that
arrives while the loop is busy is accepted by core at once and all of them reach the
loop in one turn. The accept loop itself is grpcio's, unchanged: it still takes one
call per future it awaits, and each future is answered from whichever outstanding
request came back first.

The hook is private to grpcio; :func:`open_server` checks it is there and falls back to
``grpc.aio.server`` (one call at a time) where it is not, or when ``ahead`` is 1.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from typing import Any

import grpc

from sordino.server.grpc_log import quiet_unfinished_calls

__all__ = ["AcceptAhead", "accept_ahead_supported", "open_server"]

log = logging.getLogger("sordino.grpc")

CHECKED_GRPCIO = "1.85."
"""The grpcio minor whose accept loop this module was read against and tested on."""

try:  # grpcio's private parts this module builds on; absent in other versions
    from grpc._cython import cygrpc
    from grpc.aio import _server as _aio_server

    _BASE: Any = cygrpc.AioServer
    # Checked on grpcio 1.85 only: another minor may keep the names and change what the
    # accept loop expects of them, so it gets grpc.aio's own accept loop.
    _SUPPORTED = (
        grpc.__version__.startswith(CHECKED_GRPCIO)
        and hasattr(_BASE, "_make_request_call_future")
        and hasattr(_BASE, "_request_call")
    )
except (ImportError, AttributeError):  # pragma: no cover - other grpcio builds
    _BASE = object
    _SUPPORTED = False


def accept_ahead_supported() -> bool:
    """Whether this grpcio lets calls be requested ahead (else one at a time)."""
    return _SUPPORTED


class AcceptAhead(_BASE):  # type: ignore[misc]
    """``cygrpc.AioServer`` with ``ahead`` generic call requests outstanding in core."""

    def __init__(self, *args: Any, ahead: int) -> None:
        super().__init__(*args)
        self._event_loop: asyncio.AbstractEventLoop = args[0]
        self._ahead = ahead
        self._outstanding = 0
        self._arrived: deque[asyncio.Future[Any]] = deque()
        self._waiter: asyncio.Future[Any] | None = None

    def _make_request_call_future(self, method_bytes: Any) -> Any:
        """Return a future of the next generic call: done at once when one is waiting,
        else resolved by the first outstanding request that comes back."""
        if method_bytes is not None:  # registered methods: grpc.aio's own way
            return super()._make_request_call_future(method_bytes)
        self._top_up()
        future: asyncio.Future[Any] = self._event_loop.create_future()
        if self._arrived:
            _transfer(self._arrived.popleft(), future)
        else:
            self._waiter = future
        return future

    def _top_up(self) -> None:
        if not self.is_running():
            return
        while self._outstanding < self._ahead:
            self._outstanding += 1
            task = self._event_loop.create_task(self._request_call())
            task.add_done_callback(self._came_back)

    def _came_back(self, task: asyncio.Future[Any]) -> None:
        """Hand a request that came back (a call, or core's refusal while stopping) to
        the accept loop's waiting future, or keep the call until it asks."""
        self._outstanding -= 1
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            _transfer(task, waiter)
        elif task.cancelled() or task.exception() is not None:
            # Shutting down (or the waiter was cancelled): nobody takes it.
            return
        else:
            self._arrived.append(task)
        self._top_up()


def _transfer(source: asyncio.Future[Any], target: asyncio.Future[Any]) -> None:
    if source.cancelled():
        target.cancel()
    elif (error := source.exception()) is not None:
        target.set_exception(error)
    else:
        target.set_result(source.result())


def open_server(options: Sequence[tuple[str, Any]], ahead: int) -> Any:
    """Return a ``grpc.aio`` server keeping ``ahead`` call requests outstanding.

    With ``ahead`` 1, or on a grpcio without the hook, it is ``grpc.aio.server``.
    A call whose answer could not be sent (its client gone) is logged in one DEBUG
    line, not grpc.aio's ERROR and traceback (``server/grpc_log.py``).
    """
    quiet_unfinished_calls()
    if ahead <= 1 or not _SUPPORTED:
        if ahead > 1:
            log.info(
                "grpcio %s: gRPC calls are accepted one at a time (accept-ahead is checked "
                "on grpcio %sx only)",
                grpc.__version__,
                CHECKED_GRPCIO,
            )
        return grpc.aio.server(options=options)
    # Built as grpc.aio.server builds it (grpc/aio/_server.py), with the subclass.
    server = _aio_server.Server.__new__(_aio_server.Server)
    server._loop = cygrpc.get_working_loop()
    server._server = AcceptAhead(
        server._loop,
        None,
        (),
        None,
        _aio_server._augment_channel_arguments(tuple(options), None),
        None,
        ahead=ahead,
    )
    return server
