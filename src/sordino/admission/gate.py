"""The traffic gate: an admission link the guardian turns to take load off a model.

Three controls, each per model (or ``None`` for every model), each undone by the
guardian when its condition has cleared:

- **throttle**: a share of the requests at the lowest priority level is refused (503);
  higher levels are untouched. The refusals are spread evenly (every 5th request for
  20 %), not drawn at random, so the admitted rate drops by the share itself.
- **shed_low_priority**: every request at the lowest priority level is refused.
- **skip_non_critical**: requests tagged non-critical (``X-Sordino-Tag`` or
  ``parameters.tag`` in the configured tags) are answered 503 at once.

The gate refuses with :class:`~sordino.errors.Unavailable`, before the request is
queued, so a refused request costs no model time. The ``exempt`` models (a node's
``self_healing: false``) are never refused by it.
"""

from __future__ import annotations

from dataclasses import dataclass

from sordino.admission.chain import TAG_HEADER, AdmissionContext
from sordino.errors import Unavailable
from sordino.inference import InferRequest

__all__ = ["GateStatistics", "TrafficGate"]


@dataclass(frozen=True, slots=True)
class GateStatistics:
    """What the gate does now and has refused since the server started."""

    throttled: dict[str, float]
    shedding: tuple[str, ...]
    skipping: tuple[str, ...]
    refused_throttle: int
    refused_shed: int
    refused_non_critical: int


def _scope(model: str | None) -> str:
    return model if model is not None else "*"


class TrafficGate:
    """An admission link (``gate(request, context)``); the guardian sets its controls."""

    def __init__(
        self, non_critical_tags: tuple[str, ...] = ("non-critical",), exempt: tuple[str, ...] = ()
    ) -> None:
        self._tags = frozenset(non_critical_tags)
        self._exempt = frozenset(exempt)
        self._throttle: dict[str | None, float] = {}
        self._credit: dict[tuple[str, int], float] = {}
        self._shed: set[str | None] = set()
        self._skip: set[str | None] = set()
        self._refused = {"throttle": 0, "shed": 0, "non_critical": 0}

    # -- controls --------------------------------------------------------------------

    def throttle(self, model: str | None, share: float) -> None:
        """Refuse ``share`` (0..1) of ``model``'s requests, lowest priority first; 0 ends it."""
        if share <= 0:
            self._throttle.pop(model, None)
        else:
            self._throttle[model] = min(1.0, share)

    def throttling(self, model: str | None) -> float:
        return self._throttle.get(model, 0.0)

    def shed_low_priority(self, model: str | None, on: bool) -> None:
        (self._shed.add if on else self._shed.discard)(model)

    def skip_non_critical(self, model: str | None, on: bool) -> None:
        (self._skip.add if on else self._skip.discard)(model)

    # -- the link --------------------------------------------------------------------

    def __call__(self, request: InferRequest, context: AdmissionContext) -> None:
        if not (self._throttle or self._shed or self._skip):
            return
        model = context.model
        if model in self._exempt:
            return
        lowest = context.settings.priority_levels
        if self._skip and (model in self._skip or None in self._skip):
            tag = request.parameters.get("tag") or request.headers.get(TAG_HEADER)
            if isinstance(tag, str) and tag in self._tags:
                self._refused["non_critical"] += 1
                raise Unavailable(
                    f"model {model!r} is skipping non-critical requests (tag {tag!r}) while "
                    "the guardian relieves it; retry later"
                )
        if (
            self._shed
            and context.priority == lowest
            and (model in self._shed or None in self._shed)
        ):
            self._refused["shed"] += 1
            raise Unavailable(
                f"model {model!r} is shedding its lowest priority ({lowest}) while the guardian "
                "relieves it; retry later or send at a higher priority"
            )
        share = max(self._throttle.get(model, 0.0), self._throttle.get(None, 0.0))
        if share <= 0:
            return
        if context.priority != lowest:
            return
        key = (model, context.priority)
        credit = self._credit.get(key, 0.0) + share
        if credit >= 1.0 - 1e-9:
            self._credit[key] = credit - 1.0
            self._refused["throttle"] += 1
            raise Unavailable(
                f"model {model!r} is throttled by {share:.0%} at priority {lowest} "
                "while the guardian relieves it; retry later"
            )
        self._credit[key] = credit

    def statistics(self) -> GateStatistics:
        return GateStatistics(
            throttled={_scope(m): s for m, s in self._throttle.items()},
            shedding=tuple(sorted(_scope(m) for m in self._shed)),
            skipping=tuple(sorted(_scope(m) for m in self._skip)),
            refused_throttle=self._refused["throttle"],
            refused_shed=self._refused["shed"],
            refused_non_critical=self._refused["non_critical"],
        )
