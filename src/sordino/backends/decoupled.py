"""The contract of a decoupled backend: the model sends its own responses, when it likes.

A decoupled model (Triton's ``model_transaction_policy { decoupled: true }``) answers
each request of a batch with zero or more responses and then a final flag, from the
call that received the batch or from threads it started, before or after that call
returned. Its :class:`~sordino.inference.ModelMetadata` has ``decoupled`` set, and the
backend satisfies :class:`DecoupledBackend`: :meth:`DecoupledBackend.infer_decoupled`
runs the batch and returns once the model is ready for another batch (Triton: once
``execute`` returned); every response goes to the :class:`Responder` meanwhile or later.

Whoever calls it (a worker process, or a thread of the server for ``isolation:
thread``) gives a :class:`Responder` that carries each response to the server as it
comes and says whether the client has cancelled a request. A response may be sent from
any thread, so a responder is thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from sordino.inference import RequestFacts, Tensor

__all__ = ["DecoupledBackend", "Responder"]


class Responder(Protocol):
    """Where a decoupled batch's responses go; safe to call from any thread."""

    def respond(
        self,
        index: int,
        outputs: dict[str, np.ndarray] | None,
        final: bool,
        error: str | None = None,
        code: int = 1,
    ) -> None:
        """Request ``index`` of the batch gets a response (``outputs``; None with
        ``final`` alone), or the model's ``error`` (Triton's error ``code``: 1 is
        ``INTERNAL``), which is one response of the stream as any other. ``final``: it
        gets no more."""
        ...

    def cancelled(self, index: int) -> bool:
        """Whether the client of request ``index`` has cancelled it (it may stop sending)."""
        ...


@runtime_checkable
class DecoupledBackend(Protocol):
    """A backend whose model sends its responses through a :class:`Responder`."""

    def infer_decoupled(
        self,
        batch: dict[str, Tensor],
        rows: Sequence[int],
        responder: Responder,
        facts: Sequence[RequestFacts] = (),
    ) -> None:
        """Run ``batch`` (``rows``: each request's row count, empty for one request;
        ``facts``: each request's facts, as ``RequestBatchBackend.infer_requests`` gets).

        Returns when the model can take another batch; responses may still come after.
        Raises when the model failed the batch: the requests that have not had their
        final response then end with that error, and their senders are closed.
        """
        ...
