"""The thread a thread instance's model runs on: one daemon thread, running what is
submitted in order — as ``ThreadPoolExecutor(max_workers=1)``, but a daemon.

Python waits at exit for a ``ThreadPoolExecutor``'s threads: a model whose ``execute``
or ``finalize`` never returns (left to its thread once its timeout passed: a thread
cannot be killed) kept ``sordino start`` from ending after "stopped", forever. A daemon
thread does not hold the exit.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

__all__ = ["ModelThread"]

T = TypeVar("T")

_Work = tuple[Future[Any], Callable[..., Any], tuple[Any, ...], dict[str, Any]]


class ModelThread(Executor):
    """An executor of one daemon thread named ``name``."""

    def __init__(self, name: str) -> None:
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        if self._closed:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future: Future[T] = Future()
        self._work.put((future, fn, args, kwargs))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """End the thread once what was submitted has run (``wait``: wait for that)."""
        self._closed = True
        self._work.put(None)
        if wait:
            self._thread.join()

    def _run(self) -> None:
        while (work := self._work.get()) is not None:
            future, fn, args, kwargs = work
            del work
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # as ThreadPoolExecutor: the caller's to see
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, fn, args, kwargs
