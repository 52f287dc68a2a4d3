"""The header rule (``server/early_shed.py``'s :class:`HeaderShed`) in the engine's own
process, on its live schedulers; ``server/board_shed.py`` is its twin in a front-end
process, on the engine's load board."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from sordino.errors import NotFound, Unavailable
from sordino.server.early_shed import HeaderShed, ShedRoute
from sordino.server.loop_lag import LoopLag

if TYPE_CHECKING:
    from sordino.server.runtime import Runtime

__all__ = ["EarlyShed"]


class EarlyShed(HeaderShed):
    """The header rule in the engine's own process, on its live schedulers."""

    def __init__(self, runtime: Runtime, lag: LoopLag | None = None) -> None:
        rules = {r.tag: r.priority for r in runtime.config.scheduler.priority_rules}
        super().__init__(rules, lag)
        self._runtime = runtime

    def _skip(self) -> bool:
        runtime = self._runtime
        return runtime.tenants.required or runtime.stopping

    def _route(self, model: str, version: str | None) -> ShedRoute | None:
        runtime = self._runtime
        try:
            loaded = runtime.get(model, version)
        except (NotFound, Unavailable):
            return None  # the ordinary path answers an unknown model
        scheduler = loaded.scheduler
        return ShedRoute(
            settings=loaded.scheduling.queue,
            eligible=loaded.pipeline is None
            and loaded.sequences is None
            and not runtime.result_cache.active(model),
            late=scheduler.shed_unread,
            note=scheduler.note_unread_refusal,
        )

    def _flush(self, refused: Counter[tuple[str, str | None, str | None, str]]) -> None:
        for (model, version, tenant, reason), count in refused.items():
            self._runtime.service.refused_unread(model, version, tenant, reason, count)
