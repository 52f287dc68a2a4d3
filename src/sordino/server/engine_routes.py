"""The transports' side of an engine on its own loop (``server.engine_loop: thread``).

The HTTP protocol and grpc.aio stay on the server's loop; what reaches the runtime is
handed to the engine's (``server/engine_loop.py``):

- :class:`HandedInferCycle` — ``POST …/infer``: the body is read here, then
  ``fast_infer.answer_infer`` runs on the engine's loop and its answer is written
  here in one write. A client that leaves while the service has the request cancels
  it there (:class:`_Handed`), with the same outcome as on one loop;
- :func:`on_engine` — the Starlette app runs on the engine's loop, its ``receive`` and
  ``send`` coming back to this one;
- :func:`handed_unary`, :func:`handed_stream` — the gRPC servicer's methods run on the
  engine's loop with a call context whose ``read`` and ``write`` come back here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sordino.errors import Cancelled, SordinoError
from sordino.server.engine_loop import Engine, ThreadEngine
from sordino.server.fast_infer import answer_infer, check_declared
from sordino.server.http_cycle import Cycle, InferCycle

__all__ = ["HandedInferCycle", "handed_stream", "handed_unary", "on_engine"]

T = TypeVar("T")


class _Handed:
    """One inference request on the engine's loop: while the service has it, a
    disconnect cancels it and it ends as :class:`Cancelled` (``InferCycle``'s rule)."""

    __slots__ = ("gone", "task", "working")

    def __init__(self) -> None:
        self.task: asyncio.Task[Any] | None = None
        self.working = False
        self.gone = False

    async def answer(self, work: Coroutine[Any, Any, T]) -> T:
        self.task = asyncio.current_task()
        return await work

    async def watch(self, work: Awaitable[T]) -> T:
        self.working = True
        try:
            return await work
        except asyncio.CancelledError:
            if not self.gone:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            raise Cancelled("the client disconnected before the response was ready") from None
        finally:
            self.working = False

    def disconnect(self) -> None:
        """The client left (called on the engine's loop)."""
        if self.working and not self.gone and self.task is not None:
            self.gone = True
            self.task.cancel()


class HandedInferCycle(InferCycle):
    """``…/infer`` with the engine on its own loop: read here, answered there, written here."""

    __slots__ = ("_handed",)

    async def _answer(self) -> None:
        if self.method != "POST":
            await super()._answer()
            return
        conn = self.conn
        runtime = conn.runtime
        declared = next((value for name, value in self.headers if name == b"content-length"), None)
        body, error = b"", None
        try:
            check_declared(runtime.config.server.max_request_size, declared)
            body = await self.read_body()
        except SordinoError as exc:  # raised again on the engine's loop, counted there
            error = exc

        async def read() -> bytes:
            if error is not None:
                raise error
            return body

        handed = self._handed = _Handed()
        status, payload, headers = await conn.engine.call(
            handed.answer(
                answer_infer(
                    runtime,
                    self.model,
                    self.version,
                    self.headers,
                    read,
                    handed.watch,
                    client=self.client,
                    received_at=self.received_at,
                    path=self.path,
                )
            )
        )
        self.respond(status, payload, headers)

    def disconnect(self) -> None:
        Cycle.disconnect(self)
        handed = getattr(self, "_handed", None)
        if handed is not None and not self.response_complete:
            self.conn.engine.soon(handed.disconnect)


def on_engine(app: ASGIApp, engine: Engine) -> ASGIApp:
    """``app`` run on ``engine``'s loop (itself when the engine shares this loop)."""
    if not isinstance(engine, ThreadEngine):
        return app

    async def bridged(scope: Scope, receive: Receive, send: Send) -> None:
        here = asyncio.get_running_loop()

        async def receive_here() -> Message:
            return await engine.back(receive(), here)

        async def send_here(message: Message) -> None:
            await engine.back(send(message), here)

        await engine.call(_app_call(app, scope, receive_here, send_here))

    return bridged


async def _app_call(app: ASGIApp, scope: Scope, receive: Receive, send: Send) -> None:
    await app(scope, receive, send)


class _CallHere:
    """A grpc.aio call context used from the engine's loop: ``read`` and ``write`` run
    on the server's loop, which owns the call; the rest is the context's own."""

    def __init__(self, context: Any, engine: ThreadEngine, here: asyncio.AbstractEventLoop) -> None:
        self._context = context
        self._engine = engine
        self._here = here

    def invocation_metadata(self) -> Any:
        return self._context.invocation_metadata()

    def peer(self) -> Any:
        return self._context.peer()

    async def read(self) -> Any:
        return await self._engine.back(self._context.read(), self._here)

    async def write(self, message: Any) -> None:
        await self._engine.back(self._context.write(message), self._here)


Unary = Callable[[bytes, Any], Awaitable[Any]]


def handed_unary(method: Unary, engine: ThreadEngine) -> Unary:
    """A unary RPC run on the engine's loop (its errors raised here, for the guard)."""

    async def run(raw: bytes, context: Any) -> Any:
        here = asyncio.get_running_loop()
        return await engine.call(_awaited(method(raw, _CallHere(context, engine, here))))

    return run


def handed_stream(
    method: Callable[[Any], Awaitable[None]], engine: ThreadEngine
) -> Callable[[Any], Awaitable[None]]:
    """``ModelStreamInfer`` run on the engine's loop, the stream's reads and writes here."""

    async def run(context: Any) -> None:
        here = asyncio.get_running_loop()
        await engine.call(_awaited(method(_CallHere(context, engine, here))))

    return run


async def _awaited(work: Awaitable[T]) -> T:
    return await work
