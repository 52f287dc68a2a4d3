"""The engine side of the load board: publish each loaded route's load, every few ms.

:class:`LoadBoardPublisher` runs on the engine's event loop. It creates the board
(``server/load_board.py``), gives each loaded model route a slot, and on every tick
writes what the early-shed rules read: per priority the expected wait ahead
(:meth:`ModelScheduler.expected_wait`) and the rows ahead, the queue policy's
priority and deadline fields, whether the route is ready and refusable from its
headers, and the engine loop's lag shares (:class:`~sordino.server.loop_lag.LoopLag`).
A tick takes microseconds and never blocks (shared-memory stores, no locks, no I/O).

Ticks come every ``tick_s`` while there is work (rows queued, or the loop's lag share
below one) and every ``idle_tick_s`` otherwise, which keeps an idle board fresh
(:data:`~sordino.server.load_board.STALE_S`); a model loaded or unloaded is published at
once (the ``model_loaded``/``model_unloaded`` events).
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from sordino.events import Event
from sordino.memory.segments import SEGMENTS_DIR
from sordino.protocol.validate import json_values
from sordino.server.load_board import (
    MAX_LEVELS,
    NAME_BYTES,
    VERSION_BYTES,
    LoadBoard,
    RouteLoad,
)
from sordino.server.loop_lag import LoopLag
from sordino.server.registry import LoadedModel
from sordino.server.runtime import Runtime

__all__ = ["LoadBoardPublisher"]

log = logging.getLogger("sordino.server")


class LoadBoardPublisher:
    """Publishes the engine's load on a :class:`LoadBoard` from the engine's loop.

    ``start()`` on the engine's running loop, ``close()`` at shutdown (the board is
    removed). ``lag`` is the engine loop's :class:`LoopLag`, if it measures one: while
    the board is busy it is kept measuring, and its shares are published.
    """

    def __init__(
        self,
        runtime: Runtime,
        *,
        lag: LoopLag | None = None,
        slots: int = 64,
        tick_s: float = 0.005,
        idle_tick_s: float = 0.1,
        registry: Path | None = None,
    ) -> None:
        self._runtime = runtime
        self.lag = lag
        self.tick_s = tick_s
        self.idle_tick_s = idle_tick_s
        self._slots_wanted = slots
        self._registry = registry or runtime.config.server.data_dir / SEGMENTS_DIR
        self.board: LoadBoard | None = None
        self._slots: dict[tuple[str, str], int] = {}  # route → slot
        self._defaults: dict[str, str] = {}  # name → its default version, as published
        self._overflow: set[tuple[str, str]] = set()
        self._values: dict[tuple[str, str], tuple[LoadedModel, int | None]] = {}
        """Each route's most values a request holds, with the model it was worked out for."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.published = 0
        """Ticks published so far."""

    @property
    def name(self) -> str:
        """The board's segment name: what each front end attaches to."""
        if self.board is None:
            raise RuntimeError("the load board publisher is not started")
        return self.board.name

    def start(self) -> None:
        """Create the board and publish now, then on every tick (on the running loop)."""
        if self.board is not None:
            return
        self._loop = asyncio.get_running_loop()
        self.board = LoadBoard.create(self._registry, self._slots_wanted)
        self._runtime.events.subscribe(self._on_event)
        self._tick()

    def close(self) -> None:
        """Stop publishing and remove the board (front ends then see it gone)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        board, self.board = self.board, None
        if board is not None:
            board.close()

    def _on_event(self, event: Event) -> None:
        # Emitted on the engine's loop, right after the registry changed.
        if event.kind in ("model_loaded", "model_unloaded") and self.board is not None:
            self.publish()

    def _tick(self) -> None:
        try:
            busy = self.publish()
        except Exception:  # a board left stale refuses nothing: keep trying, say why
            log.exception("publishing the load board failed; front ends refuse nothing")
            busy = False
        loop = self._loop
        assert loop is not None
        if self.board is not None:
            self._timer = loop.call_later(self.tick_s if busy else self.idle_tick_s, self._tick)

    def publish(self) -> bool:
        """Write every route and the header now; return whether there is work (rows
        queued or the loop's lag share cut), which keeps the ticks fast."""
        board = self.board
        if board is None:
            return False
        runtime = self._runtime
        models = runtime.registry.models()
        live = {(m.key.name, m.key.version): m for m in models}
        moved = self._assign(board, live)
        busy = False
        for route, slot in self._slots.items():
            load = self._load(live[route])
            busy = busy or any(load.rows_ahead)
            board.write_route(slot, load)
        lag = self.lag
        share = top = 1.0
        last = 0.0
        if lag is not None:
            share, top, last = lag.share, lag.top_share, lag.last_lag_s
            busy = busy or share < 1.0 or top < 1.0
            if busy and self._loop is not None:
                lag.request_seen(self._loop)  # keep it measuring while there is work
        if moved:
            board.bump_generation()
        board.write_header(
            share=share, top_share=top, last_lag_s=last,
            tenants_required=runtime.tenants.required, stopping=runtime.stopping,
            overflow=len(self._overflow),
        )  # fmt: skip
        self.published += 1
        return busy

    def _assign(self, board: LoadBoard, live: dict[tuple[str, str], LoadedModel]) -> bool:
        """Free the slots of routes gone, give new routes free slots; whether any moved."""
        moved = False
        for route in [r for r in self._slots if r not in live]:
            board.write_route(self._slots.pop(route), None)
            self._values.pop(route, None)
            moved = True
        self._overflow &= set(live)
        taken = set(self._slots.values())
        free = (i for i in range(board.slots) if i not in taken)
        for route in sorted(live):
            if route in self._slots or route in self._overflow:
                continue
            name, version = route
            too_long = len(name.encode()) > NAME_BYTES or len(version.encode()) > VERSION_BYTES
            slot = None if too_long else next(free, None)  # a slot only for a route it takes
            if slot is None:
                self._overflow.add(route)
                log.warning(
                    "model %s:%s is not on the load board (%s): front ends forward its "
                    "requests for the engine to refuse",
                    name, version,
                    "its name is too long" if too_long else f"all {board.slots} slots taken",
                )  # fmt: skip
                continue
            self._slots[route] = slot
            moved = True
        defaults = {name: self._runtime.registry.versions(name)[-1] for name, _ in live}
        if defaults != self._defaults:
            self._defaults = defaults
            moved = True
        return moved

    def _load(self, model: LoadedModel) -> RouteLoad:
        runtime = self._runtime
        key = model.key
        settings = model.scheduling.queue
        levels = range(1, min(settings.priority_levels, MAX_LEVELS) + 1)
        scheduler = model.scheduler
        return RouteLoad(
            name=key.name,
            version=key.version,
            default=self._defaults.get(key.name) == key.version,
            ready=True,  # in the registry: loaded, warmed up, serving
            # (Levels with queue policies of their own are the engine's to judge: the
            # board carries the model's one policy.)
            eligible=model.pipeline is None
            and model.sequences is None
            and not settings.levels
            and not runtime.result_cache.active(key.name),
            settings=settings,
            waits=tuple(scheduler.admission_wait(p) for p in levels),
            rows_ahead=tuple(scheduler.rows_ahead(p) for p in levels),
            json_values=self._json_values(model),
        )

    def _json_values(self, model: LoadedModel) -> int | None:
        """The most values a request to ``model`` holds (worked out once a model)."""
        route = (model.key.name, model.key.version)
        known = self._values.get(route)
        if known is None or known[0] is not model:  # a first publish, or reloaded
            given = json_values(model.metadata, model.scheduling.max_batch_size)
            known = self._values[route] = (model, given)
        return known[1]
