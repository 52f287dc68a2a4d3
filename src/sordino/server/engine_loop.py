"""Where the engine runs: on the server's event loop, or on its own in a thread.

``server.engine_loop`` (issue 30). With ``shared`` (the default) one event loop does
everything, as before: :class:`SharedEngine` runs a coroutine by awaiting it. With
``thread``, :class:`ThreadEngine` runs an event loop of the same kind in a thread of
its own, and everything that reaches the runtime — model loading and unloading, the
scheduler, the memory manager and its arena, the executor and its worker pipes, the
telemetry hub, model control, the Starlette routes and the gRPC servicer — runs
there; the server's loop keeps the transports: uvicorn's sockets and the HTTP
protocol (parse, guards, reads and writes) and grpc.aio's calls.

What crosses between the two loops is a coroutine one way and its outcome the other
(:meth:`ThreadEngine.call`), through a :class:`_Mailbox` each way: one wake-up of the
other loop for everything posted before it runs, rather than one a call. The
figures that decided the default are in docs/benchmarks.md ("The engine on a loop of
its own in a thread (issue 30)").
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Literal, TypeVar

__all__ = ["Engine", "SharedEngine", "ThreadEngine", "open_engine"]

T = TypeVar("T")


class Engine:
    """Runs the engine's coroutines; :class:`SharedEngine` and :class:`ThreadEngine`."""

    threaded: bool = False
    """Whether the engine's loop is another thread's (what it calls must come back)."""

    async def call(self, work: Coroutine[Any, Any, T]) -> T:
        """``work``'s result, run on the engine's loop, awaited from the server's.

        Cancelling the caller cancels ``work`` and returns only once it has ended, as
        awaiting it on one loop does.
        """
        raise NotImplementedError

    def soon(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` on the engine's loop (from the server's)."""
        raise NotImplementedError

    def start(self) -> None:
        """Start the engine's loop (nothing for the shared one)."""

    def close(self) -> None:
        """Stop the engine's loop once what :meth:`call` started has ended."""


class SharedEngine(Engine):
    """The engine on the server's own event loop: a call is an ``await``."""

    async def call(self, work: Coroutine[Any, Any, T]) -> T:
        return await work

    def soon(self, callback: Callable[[], None]) -> None:
        callback()


class _Mailbox:
    """Callbacks for ``loop`` from one other thread, in order; one wake-up of ``loop``
    (``call_soon_threadsafe``: a write to its self-pipe) for all posted before it runs
    them. The flag is cleared before the callbacks run, so nothing posted is missed."""

    __slots__ = ("_armed", "_items", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[Callable[[], None]] = deque()
        self._armed = False

    def post(self, callback: Callable[[], None]) -> None:
        self._items.append(callback)
        if not self._armed:
            self._armed = True
            self._loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        self._armed = False
        items = self._items
        while items:
            items.popleft()()


class ThreadEngine(Engine):
    """The engine on an event loop of its own, in a thread (``sordino-engine``)."""

    threaded = True

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._to_engine: _Mailbox | None = None
        self._to_server: _Mailbox | None = None

    def start(self) -> None:
        """Start the thread and its loop, of the kind the server's loop is (uvloop or not)."""
        server = asyncio.get_running_loop()
        factory: Callable[[], asyncio.AbstractEventLoop] = type(server)
        self._thread = threading.Thread(
            target=self._run, args=(factory,), name="sordino-engine", daemon=True
        )
        self._thread.start()
        self._ready.wait()
        assert self.loop is not None
        self._to_engine = _Mailbox(self.loop)
        self._to_server = _Mailbox(server)

    def _run(self, factory: Callable[[], asyncio.AbstractEventLoop]) -> None:
        loop = factory()
        asyncio.set_event_loop(loop)
        self.loop = loop
        loop.call_soon(self._ready.set)
        try:
            loop.run_forever()
            # What is left (a timer task of a closed part) ends as asyncio.run ends it.
            tasks = asyncio.all_tasks(loop)
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    def close(self) -> None:
        if self.loop is not None and self._thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
        self.loop = None
        self._thread = None
        self._to_engine = self._to_server = None

    def soon(self, callback: Callable[[], None]) -> None:
        assert self._to_engine is not None, "the engine's loop is not running"
        self._to_engine.post(callback)

    async def call(self, work: Coroutine[Any, Any, T]) -> T:
        engine, to_engine, to_server = self.loop, self._to_engine, self._to_server
        assert engine is not None and to_engine is not None and to_server is not None, (
            "the engine's loop is not running"
        )
        done: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        held: list[asyncio.Task[T]] = []

        def settle(task: asyncio.Task[T]) -> None:  # on the server's loop
            if done.done():
                return
            if task.cancelled():
                done.cancel()
            elif (error := task.exception()) is not None:
                done.set_exception(error)
            else:
                done.set_result(task.result())

        def begin() -> None:  # on the engine's loop
            task = engine.create_task(work)
            held.append(task)
            task.add_done_callback(lambda t: to_server.post(lambda: settle(t)))

        to_engine.post(begin)
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            if done.done():
                raise

            # Cancel the work (begin ran first: the loop keeps their order) and wait for
            # it to unwind before the caller goes on.
            def cancel() -> None:
                held[0].cancel()

            to_engine.post(cancel)
            with contextlib.suppress(BaseException):
                await done
            raise

    async def back(self, work: Awaitable[T], loop: asyncio.AbstractEventLoop) -> T:
        """From the engine's loop: ``work`` (a coroutine) run on ``loop``, the server's."""
        coro: Coroutine[Any, Any, T] = _coroutine(work)
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


async def _coroutine(work: Awaitable[T]) -> T:
    return await work


def open_engine(kind: Literal["shared", "thread"]) -> Engine:
    """The engine for ``server.engine_loop`` (not started)."""
    return ThreadEngine() if kind == "thread" else SharedEngine()
