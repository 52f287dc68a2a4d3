"""User satisfaction: clients rate requests, and the ratings meet the request's figures.

A client posts ``{"request_id": ..., "rating": 1-5}`` (or ``{"tag": ..., "rating": ...}``)
to ``POST /v2/feedback``. :class:`RecentRequests`, a scheduler observer, remembers the
last ``RECENT_REQUESTS`` requests that carried an id, for ``RECENT_S`` seconds: model,
latency, outcome and whether the answer was degraded. A rating of one of those is
journaled as a ``feedback`` event with those figures beside it, so ``sordino diagnose``
and ``sordino postmortem`` correlate satisfaction with latency, degradation and errors
(:mod:`sordino.telemetry.satisfaction`) from the journal alone.

Decisions: ids longer than ``MAX_REQUEST_ID`` are not remembered (a rating naming one is
400); a request id the server does not remember (never seen, older than
``RECENT_S``, or pushed out by newer ones) is refused with 404 — a rating nobody can
relate to a request would only add noise; a request is rated once (409 after); a tag
rating carries no request figures and counts in the per-tag means only. Each client
address may rate ``PER_CLIENT_PER_MIN`` times a minute (429 after, with Retry-After),
and the server keeps the last ``KEEP`` ratings in memory (the journal keeps them for
``telemetry.retention``).
"""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sordino.errors import Conflict, InvalidRequest, NotFound, RateLimited
from sordino.inference import ModelKey
from sordino.records import BatchDone, RequestDone

__all__ = [
    "FEEDBACK_KIND",
    "KEEP",
    "MAX_REQUEST_ID",
    "PER_CLIENT_PER_MIN",
    "RECENT_REQUESTS",
    "RECENT_S",
    "Feedback",
    "Rating",
    "RecentRequests",
    "RequestFacts",
]

FEEDBACK_KIND = "feedback"
RECENT_REQUESTS = 10_000
RECENT_S = 3600.0
PER_CLIENT_PER_MIN = 60
KEEP = 10_000
MAX_TAG = 64
MAX_REQUEST_ID = 256
"""The longest request id kept for ratings: a request with a longer one is served as any
other but not remembered (ids of 1 MB, each kept among the last ``RECENT_REQUESTS``,
grew a server by 1 MB a request: 10 GB at the ring's size)."""
_MAX_CLIENTS = 10_000
_FIELDS = ("request_id", "tag", "rating")


@dataclass(frozen=True, slots=True)
class RequestFacts:
    """What a rated request was like: its model, latency, outcome and degradation."""

    model: str
    version: str
    latency_ms: float
    outcome: str
    reason: str
    t: float
    degraded: bool = False


@dataclass(frozen=True, slots=True)
class Rating:
    """One rating as journaled: the score, what it rates, and the request's figures."""

    t: float
    rating: int
    request_id: str | None
    tag: str | None
    request: RequestFacts | None


class RecentRequests:
    """The last requests that carried an id (a scheduler observer; bounded in count and age)."""

    def __init__(
        self, *, keep: int = RECENT_REQUESTS, wall: Callable[[], float] = time.time
    ) -> None:
        self._keep = keep
        self._wall = wall
        self._facts: OrderedDict[str, RequestFacts] = OrderedDict()

    def request_done(self, done: RequestDone) -> None:
        if done.request_id is None or len(done.request_id) > MAX_REQUEST_ID:
            return
        facts = RequestFacts(
            done.model.name,
            done.model.version,
            done.total_s * 1000,
            done.outcome,
            done.reason,
            self._wall(),
        )
        self._facts.pop(done.request_id, None)  # a reused id: the latest request is meant
        self._facts[done.request_id] = facts
        while len(self._facts) > self._keep:
            self._facts.popitem(last=False)

    def batch_done(self, done: BatchDone) -> None:
        pass

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        pass

    def mark_degraded(self, request_id: str | None) -> None:
        """Note that the request was answered degraded (fewer denoising steps than asked)."""
        if request_id is None:
            return
        facts = self._facts.get(request_id)
        if facts is not None:
            self._facts[request_id] = replace(facts, degraded=True)

    def find(self, request_id: str) -> RequestFacts | None:
        """The request's figures, or None when it is unknown or older than ``RECENT_S``."""
        facts = self._facts.get(request_id)
        if facts is None or self._wall() - facts.t > RECENT_S:
            return None
        return facts


class Feedback:
    """Validates, bounds and journals ratings; keeps the last ``KEEP`` for the live view."""

    def __init__(
        self,
        journal: Callable[..., None],
        *,
        requests: RecentRequests,
        wall: Callable[[], float] = time.time,
        per_client_per_min: int = PER_CLIENT_PER_MIN,
        keep: int = KEEP,
    ) -> None:
        """``journal(kind, subject, cause, **payload)`` writes one event to the journal."""
        self._journal = journal
        self.requests = requests
        self._wall = wall
        self._per_client = per_client_per_min
        self._clients: OrderedDict[str, deque[float]] = OrderedDict()
        self._rated: set[str] = set()
        self.ratings: deque[Rating] = deque(maxlen=keep)

    def rate(self, body: Mapping[str, Any], *, client: str) -> Rating:
        """Record the rating in ``body`` from ``client`` (its address); return it.

        Raises :class:`InvalidRequest` (400) for a malformed body, :class:`NotFound` (404)
        for a request id not among the recent ones, :class:`Conflict` (409) for a request
        rated before, :class:`RateLimited` (429) past the client's rate.
        """
        rating, request_id, tag = _parse(body)
        facts = None
        if request_id is not None:
            facts = self.requests.find(request_id)
            if facts is None:
                raise NotFound(
                    f"no recent request with id {request_id!r}: ratings are taken for the "
                    f"last {RECENT_REQUESTS} requests that carried an id, for "
                    f"{RECENT_S / 60:.0f} minutes; send the id the inference response "
                    "carried, or rate a tag instead"
                )
            if request_id in self._rated:
                raise Conflict(f"request {request_id!r} was rated already")
        self._admit(client)
        now = self._wall()
        if request_id is not None:
            self._rated.add(request_id)
            if len(self._rated) > RECENT_REQUESTS:  # ids past RECENT_REQUESTS are unknown anyway
                self._rated = {r.request_id for r in self.ratings if r.request_id is not None}
        entry = Rating(now, rating, request_id, tag, facts)
        self.ratings.append(entry)
        subject = f"{facts.model}/{facts.version}" if facts is not None else f"tag:{tag}"
        payload: dict[str, Any] = {"rating": rating, "request_id": request_id, "tag": tag}
        if facts is not None:
            payload |= {
                "latency_ms": facts.latency_ms,
                "outcome": facts.outcome,
                "reason": facts.reason,
                "degraded": facts.degraded,
            }
        self._journal(FEEDBACK_KIND, subject, f"rated {rating}/5", **payload)
        return entry

    def _admit(self, client: str) -> None:
        now = self._wall()
        times = self._clients.pop(client, None) or deque()
        while times and now - times[0] >= 60.0:
            times.popleft()
        if len(times) >= self._per_client:
            self._clients[client] = times
            retry = max(1.0, 60.0 - (now - times[0]))
            raise RateLimited(
                f"{client} sent {len(times)} ratings in the last minute, the most a client "
                f"may send ({self._per_client}); retry in {retry:.0f} s",
                retry_after_s=retry,
            )
        times.append(now)
        self._clients[client] = times
        while len(self._clients) > _MAX_CLIENTS:
            self._clients.popitem(last=False)

    def payloads(self) -> list[dict[str, Any]]:
        """The kept ratings as ``feedback`` event payloads (what the journal holds)."""
        out = []
        for r in self.ratings:
            item: dict[str, Any] = {"rating": r.rating, "request_id": r.request_id, "tag": r.tag}
            if r.request is not None:
                item |= {
                    "latency_ms": r.request.latency_ms,
                    "outcome": r.request.outcome,
                    "degraded": r.request.degraded,
                }
            out.append(item)
        return out


def _parse(body: Mapping[str, Any]) -> tuple[int, str | None, str | None]:
    unknown = sorted(set(body) - set(_FIELDS))
    if unknown:
        raise InvalidRequest(
            f"unknown field(s) {', '.join(unknown)} in the rating; send "
            '{"request_id": "...", "rating": 1-5} or {"tag": "...", "rating": 1-5}'
        )
    rating = body.get("rating")
    if isinstance(rating, bool) or not isinstance(rating, int) or not 1 <= rating <= 5:
        raise InvalidRequest(f"'rating' must be a whole number from 1 to 5, not {rating!r}")
    request_id, tag = body.get("request_id"), body.get("tag")
    if request_id is None and tag is None:
        raise InvalidRequest("a rating needs 'request_id' (the inference request's id) or 'tag'")
    if request_id is not None and (not isinstance(request_id, str) or not request_id):
        raise InvalidRequest("'request_id' must be a non-empty string")
    if request_id is not None and len(request_id) > MAX_REQUEST_ID:
        raise InvalidRequest(
            f"'request_id' is longer than {MAX_REQUEST_ID} characters: requests with longer "
            "ids are served but not kept for ratings; give requests shorter ids, or rate a tag"
        )
    if tag is not None and (not isinstance(tag, str) or not 0 < len(tag) <= MAX_TAG):
        raise InvalidRequest(f"'tag' must be a string of 1 to {MAX_TAG} characters")
    return rating, request_id, tag
