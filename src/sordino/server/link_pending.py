"""A call the engine is answering for a front end over the link, and its cancel.

Shared by the link's HTTP side (``server/engine_link.py``) and its gRPC side
(``server/grpc_link.py``): each frame that starts work gets a :class:`Pending` in its
connection's table, keyed by the frame's id; a ``CANCEL`` (or the link's loss) calls
:meth:`Pending.cancel`, which cancels the task while it is inside the service — or,
for a request answered by callback (:class:`Forwarded`), cancels it in the scheduler.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import TypeVar

from sordino.errors import Cancelled
from sordino.inference import Tensor, release_owned
from sordino.server.disconnect import client_left
from sordino.server.fast_infer import Watch
from sordino.server.infer_soon import Soon

__all__ = ["Forwarded", "Pending", "watch"]

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


class Forwarded(Pending):
    """A forwarded request the service answers by callback (``infer_soon``): a cancel
    cancels it in the scheduler and gives its granted inputs back to the front end
    (a no-op for inputs that own nothing)."""

    __slots__ = ("inputs", "soon")

    def __init__(self, inputs: Mapping[str, Tensor]) -> None:
        super().__init__()
        self.inputs = inputs
        self.soon: Soon | None = None

    def cancel(self) -> None:
        self.gone = True
        soon, self.soon = self.soon, None
        if soon is not None:
            soon.cancel()
            release_owned(self.inputs)


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
