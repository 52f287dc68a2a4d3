"""The header rule in a front-end process: refusing from the engine's load board.

A front end that is not the engine (``server.frontends``) refuses a request the
engine would shed without asking it: :class:`BoardShed` is
:class:`~sordino.server.early_shed.HeaderShed` — the same rule as the engine's own
:class:`~sordino.server.engine_shed.EarlyShed`, admission's ``choose_priority`` and
``choose_timeout``, the scheduler's ``late_refusal`` — applied to what the engine last
published (``server/load_board.py``) instead of to live schedulers. It is a
:class:`~sordino.server.connection_guard.ShedCheck` (set it as the front end's
``guard.early_shed``), and :meth:`refusal` gives ``(status, body, headers)``.

Lag: the engine loop's published shares are applied here (each front end keeps its
own credit, so each admits that share of what it sees), and so is the front end's own
:class:`~sordino.server.loop_lag.LoopLag` if it has one (its loop running late).

It refuses nothing by these rules while the board is stale (not published for
:data:`~sordino.server.load_board.STALE_S`: the engine is stuck or gone — the
forwarded request then meets the engine's own answer). Once the board has said nothing
for :data:`ENGINE_SILENT_S` (an engine stopped, ``SIGSTOP`` or a debugger, or stuck),
it refuses every inference request, 503 "the engine has not answered for N s …" with
``Retry-After``, counted as ``engine_silent``: forwarded, they would only wait — the
client until it gives up, and the engine, once it runs again, under a backlog nobody
waits for any more. It refuses nothing by its rules while the engine requires
tenants or is stopping, and for a route not on the board (unknown, overflowed, not
ready). Refusals are counted here, per loop iteration, by (model, version, tenant,
reason): ``on_refused`` receives each iteration's counts (a front end forwards them to
the engine's metrics); without it they add up in :attr:`BoardShed.refused`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from sordino.errors import Shed
from sordino.server.early_shed import HeaderShed, ShedRoute, read_kind, refusal_response
from sordino.server.load_board import STALE_S, BoardHeader, LoadBoard
from sordino.server.loop_lag import LoopLag

__all__ = ["ENGINE_SILENT_S", "BoardShed", "EngineSilent", "RefusalCounts", "attach_board_shed"]

ENGINE_SILENT_S = 10.0
"""How long the engine's board may say nothing before a front end refuses inference
(the engine publishes every 5 ms when busy, every 100 ms when idle)."""

RefusalCounts = Counter[tuple[str, str | None, str | None, str]]
"""(model, version as requested, tenant, reason) → requests refused."""


class EngineSilent(Shed):
    """Refused in a front end: the engine has published nothing for :data:`ENGINE_SILENT_S`."""

    reason = "engine_silent"


class BoardShed(HeaderShed):
    """Decides from a request's target and headers, and the engine's load board,
    whether to refuse it in this process (see the module's docstring)."""

    def __init__(
        self,
        board: LoadBoard,
        rules: Mapping[str, int | str],
        lag: LoopLag | None = None,
        *,
        on_refused: Callable[[RefusalCounts], None] | None = None,
    ) -> None:
        super().__init__(rules, lag)
        self.board = board
        self._on_refused = on_refused
        self.refused: RefusalCounts = Counter()
        """Refusals counted here when there is no ``on_refused``."""
        self._header: BoardHeader | None = None
        self._seq = board.header_seq
        self._clock = board.clock
        self._stale_at = -math.inf  # the board's clock past which it is stale
        self._published_at = math.nan  # the engine's last publish seen (nan: none)
        # The engine loop's lag, as published: a LoopLag never measured here, only
        # its admission by credit used (the same rule as in the engine's process).
        self._engine_lag = LoopLag(1.0)
        self._lags_changed()

    def _epoch(self, now: float) -> object:
        # Decisions hold until the engine publishes again (its header is written last
        # on every publish): many loop iterations under overload, not one.
        seq = self._seq()
        return self._decided_at if seq & 1 else seq

    def _new_iteration(self) -> None:
        header = self.board.header()
        self._header = header
        if header is None:  # being written all the while it was read: nothing this
            self._stale_at = -math.inf  # iteration, and read again the next
            self._decided_at = math.nan
            return
        # A stopping engine's silence is its stop's business, not a stuck engine's.
        self._published_at = math.nan if header.stopping else header.published_at
        if header.tenants_required or header.stopping:
            self._stale_at = -math.inf  # refuse nothing this epoch
            return
        self._stale_at = header.published_at + STALE_S
        engine = self._engine_lag
        engine.share, engine.top_share = header.share, header.top_share
        engine.last_lag_s = header.last_lag_s

    def __call__(self, target: bytes, headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
        refused = super().__call__(target, headers)
        if refused is None and self._skipping:
            silent_s = self._clock() - self._published_at
            if silent_s > ENGINE_SILENT_S:  # never while nothing was published (nan)
                return self._silent(target, headers, silent_s)
        return refused

    def _silent(
        self, target: bytes, headers: Sequence[tuple[bytes, bytes]], silent_s: float
    ) -> bytes | None:
        """Refuse an inference request: the engine has said nothing for ``silent_s``."""
        named = self._targets[target]
        if named is None:
            return None  # not inference: the engine answers it, as before
        error = EngineSilent(
            f"the engine has not answered for {silent_s:.0f} s (stopped or stuck): this "
            "front end refuses requests until it does; retry later or on another replica",
            retry_after_s=1.0,
        )
        counted = (named[0], named[1], read_kind(target, headers)[1], EngineSilent.reason)
        return self._refuse(counted, (error, refusal_response(error)))

    def _skip(self) -> bool:
        # Asked each loop iteration, not each epoch: the epoch lasts while the engine
        # publishes nothing, and a board that stops moving goes stale meanwhile.
        return self._clock() > self._stale_at

    def _lags(self) -> tuple[LoopLag, ...]:
        own = self.lag
        return (self._engine_lag,) if own is None else (self._engine_lag, own)

    def _route(self, model: str, version: str | None) -> ShedRoute | None:
        header = self._header
        assert header is not None  # not skipped
        route = self.board.find(header, model, version)
        if route is None or not route.ready:
            return None  # the engine answers it (404, 503 while loading, …)
        return ShedRoute(route.settings, route.eligible, route.late, None)

    def json_values(self, model: str, version: str | None) -> int | None:
        """The most values a request to ``model`` holds, as the engine published it
        (None: no bound, or not on the board): a larger JSON body is refused before it
        is parsed, as the engine refuses it (``protocol/validate.check_json_size``)."""
        header = self.board.header()
        route = None if header is None else self.board.find(header, model, version)
        return None if route is None else route.json_values

    def _flush(self, refused: RefusalCounts) -> None:
        if self._on_refused is not None:
            self._on_refused(refused)
        else:
            self.refused.update(refused)


def attach_board_shed(
    name: str,
    rules: Mapping[str, int | str],
    lag: LoopLag | None = None,
    *,
    on_refused: Callable[[RefusalCounts], None] | None = None,
) -> BoardShed:
    """Attach the engine's board ``name`` and return its :class:`BoardShed` (the
    front end's call at start-up; ``rules`` are ``scheduler.priority_rules`` as a
    tag → priority mapping; ``on_refused`` as :class:`BoardShed` takes it). Close it
    with ``shed.board.close()``."""
    return BoardShed(LoadBoard.attach(name), rules, lag, on_refused=on_refused)
