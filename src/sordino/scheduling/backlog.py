"""Bounds on what a streaming request's responses may hold while its client does not
read them.

A decoupled model sends responses at its own pace; they wait in the request's outbox
until the front end writes them, which it does as fast as the client reads. A client
that stops reading (or reads slower than the model sends) would otherwise make the
server hold every response: a model streaming 1 MB responses to a client that never
read grew the server by 3 GB. :class:`StreamBudget` counts the bytes waiting in
every metered outbox of the server; a request whose waiting responses pass
``per_request``, or whose next response would take the server's total past ``total``,
is ended with :class:`~sordino.errors.StreamBacklogFull`: its waiting responses are
dropped, the model is told the request is cancelled (``is_cancelled()``), and its
client gets the error after what it already read. The model's later responses to it
are dropped, so one slow client costs the server at most ``per_request`` and never
stalls the model's other requests.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from sordino.errors import SordinoError
from sordino.inference import Tensor
from sordino.scheduling.work import Outbox, StepOutput

__all__ = ["RESPONSE_OVERHEAD", "MeteredOutbox", "StreamBudget", "response_bytes"]

RESPONSE_OVERHEAD = 1024
"""Bytes a waiting response counts beyond its tensors' (its objects), so that a flood
of empty responses is bounded too."""


@dataclass(slots=True)
class StreamBudget:
    """The server's bytes of streamed responses waiting for their clients, and the
    bounds on them (``server.max_stream_backlog``, ``server.max_total_stream_backlog``)."""

    per_request: int
    total: int
    held: int = 0


class MeteredOutbox(Outbox):
    """A streaming request's outbox that counts the bytes waiting in it.

    Each item's size is counted once, as it is put, and kept beside it until it is
    taken: what is given back is what was counted, whatever becomes of the item.
    """

    __slots__ = ("_budget", "_bytes", "_sizes")

    def __init__(self, budget: StreamBudget) -> None:
        super().__init__()
        self._budget = budget
        self._bytes = 0
        self._sizes: deque[int] = deque()

    def overflow(self, outputs: Mapping[str, Tensor]) -> str | None:
        size = response_bytes(outputs) + RESPONSE_OVERHEAD
        budget = self._budget
        if self._bytes + size > budget.per_request:
            return (
                f"its client did not read its stream: {self._bytes} bytes of responses "
                f"waited unread, past server.max_stream_backlog ({budget.per_request} "
                "bytes); the request was cancelled — read the stream as it comes"
            )
        if budget.held + size > budget.total:
            return (
                f"the server's clients did not read their streams: {budget.held} bytes of "
                f"responses waited unread, past server.max_total_stream_backlog "
                f"({budget.total} bytes); this request (its client {self._bytes} bytes "
                "behind) was cancelled — read the stream as it comes"
            )
        return None

    def put_nowait(self, item: StepOutput | SordinoError) -> None:
        size = (
            0
            if isinstance(item, SordinoError)
            else response_bytes(item.outputs) + RESPONSE_OVERHEAD
        )
        self._sizes.append(size)
        self._bytes += size
        self._budget.held += size
        super().put_nowait(item)

    def get_nowait(self) -> StepOutput | SordinoError:
        item = super().get_nowait()
        self._taken()
        return item

    async def get(self) -> StepOutput | SordinoError:
        item = await super().get()
        self._taken()
        return item

    def _taken(self) -> None:
        size = self._sizes.popleft()
        self._bytes -= size
        self._budget.held -= size


def response_bytes(tensors: Mapping[str, Tensor]) -> int:
    """Bytes of a response's tensors; a string tensor's as its elements' lengths."""
    total = 0
    for array in tensors.values():
        if array.dtype == np.object_:
            total += sum(len(v) if isinstance(v, bytes | str) else 8 for v in array.flat)
        else:
            total += int(array.nbytes)
    return total
