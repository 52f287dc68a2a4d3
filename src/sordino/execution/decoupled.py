"""The server's end of a decoupled batch: each request's responses as the model sends them.

A decoupled model (``ModelMetadata.decoupled``) answers a batch's requests with any
number of responses each, during the batch or after it (``backends/decoupled.py``). The
scheduler makes one :class:`ResponseChannel` per such batch, with what to do for a
request's response and for its error, and hands it to the executor
(:meth:`~sordino.execution.chain.ChainExecutor.run_decoupled`). The instance running the
batch feeds it: a worker process from its :class:`~sordino.execution.messages.Respond`
frames, a thread instance from the model's threads (through the event loop).

Every request of the batch ends exactly once, in one of:

- its final response from the model (an error response too, when the model sent it
  with the final flag; one without it is a response of the stream as any other, as on
  Triton);
- :meth:`ResponseChannel.fail`: ``execute`` raised, or the worker was lost (mid-stream:
  every request still open gets the cause);
- :meth:`ResponseChannel.cancel`: the client went away; the instance is told
  (``is_cancelled()`` turns true in the model) and later responses are dropped;
- the execution timeout (:meth:`ResponseChannel.limit`): a model that never sends the
  final flag must not hold its requests for ever; they end with an error naming the
  model, and the model is told they are cancelled.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import numpy as np

from sordino.clock import Clock, TimerHandle
from sordino.errors import SordinoError, model_response_error

__all__ = ["ResponseChannel", "ThreadResponder"]

OnResponse = Callable[[int, dict[str, np.ndarray] | SordinoError, bool], None]
"""``(index, outputs, final)``: request ``index`` of the batch got a response: its
outputs, or the error the model answered with (the request goes on unless ``final``)."""
OnError = Callable[[int, str], None]
"""``(index, message)``: request ``index`` of the batch ended with an error."""


class ResponseChannel:
    """Where one decoupled batch's responses go; used on the event loop only."""

    def __init__(self, model: str, count: int, on_response: OnResponse, on_error: OnError) -> None:
        self.model = model
        self._open = set(range(count))
        self._on_response = on_response
        self._on_error = on_error
        self._cancel: Callable[[int], None] | None = None
        self._timer: TimerHandle | None = None
        self.streamed = False
        """A response reached a request: the batch may no longer be run again elsewhere."""

    @property
    def finished(self) -> bool:
        """Every request of the batch has ended (nothing more is delivered)."""
        return not self._open

    def bind(self, cancel: Callable[[int], None]) -> None:
        """Tell the instance running the batch through ``cancel(index)`` of cancellations."""
        self._cancel = cancel

    def limit(self, clock: Clock, timeout_s: float) -> None:
        """End the requests still open ``timeout_s`` from now (0: never) with an error."""
        if timeout_s > 0 and self._open and self._timer is None:
            self._timer = clock.call_at(clock.now() + timeout_s, lambda: self._expire(timeout_s))

    def response(
        self,
        index: int,
        outputs: dict[str, np.ndarray],
        final: bool,
        error: str | None,
        code: int = 1,
    ) -> None:
        """The model's response to request ``index`` (dropped once that request ended):
        ``outputs``, or the model's ``error`` message with Triton's error ``code``."""
        if index not in self._open:
            return
        self.streamed = True
        if final:
            self._end(index)
        answer = outputs if error is None else model_response_error(error, code)
        self._on_response(index, answer, final)

    def fail(self, message: str) -> None:
        """End every request still open with ``message`` (the batch failed, the worker
        was lost)."""
        for index in sorted(self._open):
            self._end(index)
            self._on_error(index, message)

    def close(self) -> list[int]:
        """End every request still open without a word (the caller answers them); return
        their indices."""
        ended = sorted(self._open)
        for index in ended:
            self._end(index)
        return ended

    def cancel(self, index: int) -> None:
        """The client of request ``index`` went away: tell the model; drop what comes."""
        if index in self._open:
            self._end(index)
            if self._cancel is not None:
                self._cancel(index)

    def _end(self, index: int) -> None:
        self._open.discard(index)
        if not self._open and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, timeout_s: float) -> None:
        self._timer = None
        for index in sorted(self._open):
            self._end(index)
            if self._cancel is not None:
                self._cancel(index)
            self._on_error(
                index,
                f"model {self.model} did not finish its responses to the request (no "
                f"TRITONSERVER_RESPONSE_COMPLETE_FINAL) within the execution timeout of "
                f"{timeout_s:g} s (workers.execution_timeout); the request was ended and "
                "the model told it is cancelled",
            )


class ThreadResponder:
    """A :class:`~sordino.backends.decoupled.Responder` for a model run on a thread of the
    server (``isolation: thread``): responses reach ``channel`` through the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, channel: ResponseChannel) -> None:
        self._loop = loop
        self._channel = channel
        self._cancelled: set[int] = set()
        channel.bind(self._cancelled.add)  # on the loop; read from the model's threads

    def respond(
        self,
        index: int,
        outputs: dict[str, np.ndarray] | None,
        final: bool,
        error: str | None = None,
        code: int = 1,
    ) -> None:
        arrays = {name: np.array(array) for name, array in (outputs or {}).items()}
        self._loop.call_soon_threadsafe(self._channel.response, index, arrays, final, error, code)

    def cancelled(self, index: int) -> bool:
        return index in self._cancelled
