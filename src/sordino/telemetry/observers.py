"""One observer for the scheduler, fanning each event out to every store that uses it.

A scheduler reports what happens to its requests and batches to one
:class:`~sordino.records.SchedulerObserver`. :class:`SchedulerObservers` is that one:
it passes each event, in order, to the Prometheus metrics, the Triton statistics,
the per-second series and the memory manager, so adding a store is one line where
the runtime builds it and never a change to the scheduler.

Most stores use only some events (the queue depth matters to the per-second series
alone). A method whose body does nothing — a docstring, ``pass`` or ``return None`` —
is left out of its event's fan-out when the observers are put together, so an event
costs one call per store that uses it, not one per store: the scheduler reports a
queue change twice a request and a batch once a batch.
"""

from __future__ import annotations

import dis
from collections.abc import Callable
from typing import Any

from sordino.inference import ModelKey
from sordino.records import BatchDone, RequestDone, SchedulerObserver

__all__ = ["SchedulerObservers", "does_nothing"]

_EMPTY = {"RESUME", "NOP", "LOAD_CONST", "RETURN_VALUE", "RETURN_CONST", "CACHE"}


def does_nothing(method: Callable[..., Any]) -> bool:
    """Whether ``method``'s body does nothing at all (only a docstring, ``pass`` or
    ``return None``): it returns None and has no effect, so calling it can be skipped."""
    function = getattr(method, "__func__", method)
    code = getattr(function, "__code__", None)
    if code is None:
        return False  # a builtin or a callable object: assume it does something
    for instruction in dis.get_instructions(code):
        if instruction.opname not in _EMPTY:
            return False
        if instruction.opname in ("LOAD_CONST", "RETURN_CONST") and instruction.argval is not None:
            return False
    return True


def _used(observers: tuple[SchedulerObserver, ...], event: str) -> tuple[Callable[..., None], ...]:
    methods = (getattr(observer, event) for observer in observers)
    return tuple(method for method in methods if not does_nothing(method))


class SchedulerObservers:
    """A :class:`SchedulerObserver` that forwards every event to several observers."""

    def __init__(self, *observers: SchedulerObserver) -> None:
        self._observers = observers
        self._request_done = _used(observers, "request_done")
        self._batch_done = _used(observers, "batch_done")
        self._queue_changed = _used(observers, "queue_changed")

    def request_done(self, done: RequestDone) -> None:
        for call in self._request_done:
            call(done)

    def batch_done(self, done: BatchDone) -> None:
        for call in self._batch_done:
            call(done)

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        for call in self._queue_changed:
            call(model, depth)
