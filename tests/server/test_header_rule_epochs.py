"""The header rule (server/early_shed.py) across epochs: what it keeps from one epoch to
the next (a target's model, the priority and deadline a route's settings give) never
hides a change — the route's live load is asked again each epoch, and new settings
give new choices.

The rule runs on a loop; the epochs are the test's own (one a request), as at 1 in
flight on a server."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

from sordino.errors import Shed
from sordino.records.scheduling import QueueSettings
from sordino.server.early_shed import HeaderShed, ShedRoute

TARGET = b"/v2/models/m/infer"


class _Rule(HeaderShed):
    """The rule on one route whose settings and load the test sets."""

    def __init__(self) -> None:
        super().__init__({})
        self.settings = QueueSettings(default_timeout_s=1.0)
        self.refusing: Shed | None = None
        self.asked: list[tuple[int, float | None]] = []
        self.epochs = 0
        self.eligible = True

    def _epoch(self, now: float) -> object:
        self.epochs += 1
        return self.epochs

    def _skip(self) -> bool:
        return False

    def _route(self, model: str, version: str | None) -> ShedRoute | None:
        return ShedRoute(settings=self.settings, eligible=self.eligible, late=self._late, note=None)

    def _late(self, priority: int, timeout_s: float | None) -> Shed | None:
        self.asked.append((priority, timeout_s))
        return self.refusing

    def _flush(self, refused: Counter[tuple[str, str | None, str | None, str]]) -> None:
        pass


def _run(rule: _Rule, headers: list[tuple[bytes, bytes]]) -> bytes | None:
    """Decide one request (on the running loop, in an epoch of its own)."""
    return rule(TARGET, headers)


async def test_the_load_is_asked_again_each_epoch() -> None:
    """A route that starts refusing is refused from the next epoch on, and one that
    stops is served again."""
    rule = _Rule()
    assert _run(rule, []) is None
    rule.refusing = Shed("the queue ahead is too long", retry_after_s=1.0)
    response = _run(rule, [])
    assert response is not None and response.startswith(b"HTTP/1.1 503 ")
    rule.refusing = None
    assert _run(rule, []) is None
    assert len(rule.asked) == 3


async def test_new_settings_give_new_choices() -> None:
    """The priority and deadline are chosen again when the route's settings change."""
    rule = _Rule()
    _run(rule, [])
    assert rule.asked == [(2, 1.0)]  # the model's defaults
    rule.settings = replace(rule.settings, default_priority=3, default_timeout_s=2.0)
    _run(rule, [])
    assert rule.asked[-1] == (3, 2.0)
    rule.settings = replace(rule.settings, default_timeout_s=0.0)  # no deadline: not asked
    _run(rule, [])
    assert len(rule.asked) == 2


async def test_headers_are_chosen_by_their_own_values() -> None:
    """Requests with different priority and timeout headers each get their own choice,
    kept or not."""
    rule = _Rule()
    for _ in range(2):
        _run(rule, [(b"x-sordino-priority", b"high"), (b"x-sordino-timeout", b"500000")])
        _run(rule, [(b"x-sordino-priority", b"low")])
    assert rule.asked == [(1, 0.5), (3, 1.0)] * 2


async def test_a_route_no_longer_eligible_is_not_asked() -> None:
    """A route that became ineligible (a result cache turned on, say) is served
    without the rule, even after its choices were kept."""
    rule = _Rule()
    _run(rule, [])
    rule.eligible = False
    rule.refusing = Shed("the queue ahead is too long", retry_after_s=1.0)
    assert _run(rule, []) is None
    assert len(rule.asked) == 1
