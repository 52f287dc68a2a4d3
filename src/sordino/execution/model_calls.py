"""Model calls (Triton's BLS) on the server side of the execution layer.

A model's code calls another model of the same server (``backends/calls.py``). The
server answers each :class:`~sordino.backends.calls.ModelCall` with a
:data:`CallServer`, an async generator of answers that the server's composition root
gives the executor (``ChainExecutor.serve_model_calls``; ``server/model_calls.py``
runs the call through the inference service, so admission, batching, priorities,
quotas and breakers apply). The call arrives:

- from a worker process, over its pipe (``WorkerProcess`` serves each
  ``ModelCallStart`` with :func:`answer_call`);
- from a thread instance, through :class:`LoopCaller`, which runs the call on the
  server's event loop.

Whatever happens — the server has no answerer, the answerer raises, the call is
cancelled — :func:`answer_call` delivers exactly one final answer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from sordino.backends.calls import CallAnswer, ModelCall, failed_answer

__all__ = ["CallServer", "LoopCaller", "answer_call"]

CallServer = Callable[[ModelCall], AsyncIterator[CallAnswer]]
"""Answers a model's call: each response as it comes, the last one ``final``."""


async def answer_call(
    server: CallServer | None, call: ModelCall, deliver: Callable[[CallAnswer], None]
) -> None:
    """Run ``call`` on ``server`` and ``deliver`` its answers, exactly one of them final.

    A cancelled call delivers a final ``CANCELLED`` answer and returns (the caller
    cancelled it, or its worker is gone: then the delivery goes nowhere).
    """
    if server is None:
        deliver(
            failed_answer(
                f"BLS call to {call.model}: this server does not answer model calls here",
                "UNSUPPORTED",
            )
        )
        return
    try:
        async with aclosing(server(call)) as answers:  # type: ignore[type-var]
            async for answer in answers:
                deliver(answer)
                if answer.final:
                    return
        deliver(failed_answer(f"BLS call to {call.model}: it ended without a response"))
    except asyncio.CancelledError:
        deliver(failed_answer(f"BLS call to {call.model} was cancelled", "CANCELLED"))
    except Exception as exc:
        deliver(failed_answer(f"BLS call to {call.model} failed: {type(exc).__name__}: {exc}"))


class LoopCaller:
    """A thread instance's :class:`~sordino.backends.calls.ModelCaller`: each call runs
    on the server's event loop; answers reach the model's thread by callback."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, server: Callable[[], CallServer | None]
    ) -> None:
        self._loop = loop
        self._server = server

    def start(self, call: ModelCall, on_answer: Callable[[CallAnswer], None]) -> Callable[[], None]:
        try:
            future = asyncio.run_coroutine_threadsafe(
                answer_call(self._server(), call, on_answer), self._loop
            )
        except RuntimeError:  # the loop is closed: the server has stopped
            on_answer(failed_answer("BLS call: the server has stopped", "UNAVAILABLE"))
            return lambda: None

        def cancel() -> None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(future.cancel)

        return cancel
