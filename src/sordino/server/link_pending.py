"""A call the engine is answering for a front end over the link, and its cancel.

Shared by the link's HTTP side (``server/engine_link.py``) and its gRPC side
(``server/grpc_link.py``): each frame that starts work gets a :class:`Pending` in its
connection's table, keyed by the frame's id; a ``CANCEL`` (or the link's loss) calls
:meth:`Pending.cancel`, which cancels the task while it is inside the service.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from sordino.errors import Cancelled
from sordino.server.disconnect import client_left
from sordino.server.fast_infer import Watch

__all__ = ["Pending", "watch"]

T = TypeVar("T")


class Pending:
    """A request or call the engine is answering for a front end."""

    __slots__ = ("gone", "task", "working")

    def __init__(self) -> None:
        self.task: asyncio.Task[None] | None = None
        self.working = False  # inside the service: a cancel cancels the task
        self.gone = False  # the front end's client left

    def cancel(self) -> None:
        """The client left: cancel the task if it is inside the service."""
        self.gone = True
        if self.working and self.task is not None:
            self.task.cancel()  # the service removes the request and counts it cancelled


def watch(pending: Pending) -> Watch:
    """Runs the service's work for ``pending``: a cancel from the front end cancels it."""

    async def watched(work: Awaitable[T]) -> T:
        pending.working = True
        try:
            if pending.gone:
                raise Cancelled("the client disconnected before the response was ready")
            return await work
        except asyncio.CancelledError:
            if not pending.gone:
                raise
            raise client_left() from None
        finally:
            pending.working = False

    return watched
