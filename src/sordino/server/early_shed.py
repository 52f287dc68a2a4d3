"""Shedding at the HTTP layer: refusing an inference request from its headers alone.

Under overload most requests are refused, and a refusal after the body is read and
decoded costs most of what serving one costs in Python (the ASGI task, the body, the
JSON): at three times capacity the refusals alone fill the core and goodput collapses
(docs/benchmarks.md, "Overload"). ``EarlyShed`` (``server/engine_shed.py``) decides from
the request line and headers, in the httptools protocol before any ASGI task exists, and
refuses with 503 and ``Retry-After`` at once; the body is skipped unread
(``http_protocol.py``). Two rules, in this order:

- **the loop is late** (:class:`~sordino.server.loop_lag.LoopLag`,
  ``server.shed_loop_lag``): while the server's own event loop runs late — the HTTP
  path is the bottleneck and requests wait unread — a share of the requests whose
  ``X-Sordino-Priority`` is below the highest level is refused, whatever their
  deadline; if the loop stays late with those down to 1 %, a share of the rest (the
  highest priority, and requests whose headers do not give one) is refused too, and
  every lower one;
- **the deadline cannot be met** (the priority and the deadline by admission's own
  rules, :func:`~sordino.admission.chain.choose_priority` and ``choose_timeout``), by
  the scheduler's own rule
  (:meth:`ModelScheduler.shed_unread`: the expected wait at the request's priority
  against its deadline), so a request refused here is one the scheduler would refuse
  after decoding.

Both need the priority (and the second the deadline) before the body, from headers:

- ``X-Sordino-Priority`` (``high``/``normal``/``low`` or a level), else (for the
  deadline rule only) the priority rule of ``X-Sordino-Tag``, else the model's default;
- ``X-Sordino-Timeout`` (microseconds, as ``parameters.timeout``), else the model's
  default timeout. A request with neither has no deadline and is never shed here.

The rule lives once, in :class:`HeaderShed`: ``server/engine_shed.py``'s ``EarlyShed``
applies it in the engine's process to the live schedulers; ``server/board_shed.py``'s
``BoardShed`` in a front-end process to what the engine published on its load board
(``server/load_board.py``), the two differing only in where a route's figures come
from, where refusals are counted and how long a decision holds (one loop iteration
here; until the next publish there).

The service reads the same headers when the body's ``parameters`` do not set the
priority or timeout, so the two decisions agree (a body that sets a *different*
priority than its header is shed by its header here). Nothing is shed here when
tenants are required (the key is checked first; a stranger learns nothing), for a
model with a result cache, an iterative model or a sequence model, or when the
request's model is unknown (the ordinary path answers those).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from sordino.admission.chain import (
    PRIORITY_HEADER,
    TAG_HEADER,
    TIMEOUT_HEADER,
    choose_priority,
    choose_timeout,
)
from sordino.errors import Shed, SordinoError
from sordino.memo import Memo
from sordino.protocol.encode import encode_error
from sordino.protocol.status import retry_after_header
from sordino.records import QueueSettings
from sordino.server.loop_lag import LoopLag

__all__ = [
    "REFUSING_S",
    "HeaderShed",
    "ShedRoute",
    "read_kind",
    "refusal_response",
]

REFUSING_S = 1.0
"""How long after a refusal whole requests are tried without the HTTP parser
(``guarded_reads.py``): under overload refusals are continuous; otherwise the parser
alone reads each request, once."""
_INFER = re.compile(rb"/v2/models/([^/?]+)(?:/versions/([^/?]+))?/infer(?:\?.*)?")
_PRIORITY = PRIORITY_HEADER.encode()
_TAG = TAG_HEADER.encode()
_TIMEOUT = TIMEOUT_HEADER.encode()
_TENANT = b"x-sordino-tenant"


class HeaderShed:
    """The header rule, once for both places it runs: decides from a request's target
    and headers whether to refuse it unread.

    ``EarlyShed`` (``server/engine_shed.py``) applies it in the engine's own process, to
    the live schedulers; :class:`~sordino.server.board_shed.BoardShed` in a front-end
    process, to the figures the engine published on its load board. A subclass says
    where a route's facts come from (:meth:`_route`), when nothing is refused at all
    (:meth:`_skip`), and where the refusals are counted (:meth:`_flush`).
    """

    def __init__(self, rules: Mapping[str, int | str], lag: LoopLag | None = None) -> None:
        self._rules = rules
        self._lag = lag
        self._refused: tuple[Shed, bytes] | None = None  # the last refusal
        self.shed = 0
        """Requests refused here (each also counted as a ``shed`` rejection)."""
        # Refusals are counted once per event-loop iteration, by kind: under overload
        # one iteration refuses hundreds, and counting each alone cost a third of a
        # refusal (label lookups in two metric families).
        self._uncounted: Counter[tuple[str, str | None, str | None, str]] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._refused_at = float("-inf")  # loop time of the last refusal
        self._now = float("nan")  # the loop time of the last request asked about
        self._skipping = False  # refusing nothing this iteration (_skip)
        self._decided: dict[_Key, _Decision | object] = {}
        self._decided_at: object = float("nan")  # the epoch they were decided in
        self._lag_refusals: dict[tuple[int, str], tuple[Shed, bytes]] = {}
        # What reads no live state is kept across epochs (at 1 in flight every request
        # is an epoch of its own): a target's model and version, and the priority and
        # deadline admission's rules give a route's settings (checked by identity).
        self._targets: Memo[bytes, tuple[str, str | None] | None] = Memo(_named, _KEPT)
        # The lag rules that apply (a subclass's own rules: see _lags).
        self._lag_rules: tuple[LoopLag, ...] = HeaderShed._lags(self)
        self._chosen: dict[tuple[bytes | None, ...], _Chosen] = {}
        # The last request's headers read (kept by identity: see __call__).
        self._read_headers: object = None
        self._read_target: object = None
        self._read: tuple[_Key, str | None] = ((b"", None, None, None), None)

    @property
    def lag(self) -> LoopLag | None:
        """Event-loop lag: while the loop runs late, lower priorities are refused first."""
        return self._lag

    @lag.setter
    def lag(self, lag: LoopLag | None) -> None:
        self._lag = lag
        self._lag_rules = self._lags()

    # -- what a subclass provides ------------------------------------------------------

    def _skip(self) -> bool:
        """Whether to refuse nothing now (tenants required, stopping, no figures):
        asked once each time the loop's clock moves (an iteration; under uvloop, whose
        clock counts milliseconds, at most once a millisecond)."""
        raise NotImplementedError

    def _epoch(self, now: float) -> object:
        """What decisions stay good for: this event-loop iteration (``now``, the
        loop's time) where the state they read is live. Asked as :meth:`_skip` is."""
        return now

    def _new_iteration(self) -> None:
        """Called once an epoch (:meth:`_epoch`), before the first request is decided."""

    def _route(self, model: str, version: str | None) -> ShedRoute | None:
        """The facts of the route a request for ``model`` goes to, or None when this
        path does not answer it (an unknown model, an odd name)."""
        raise NotImplementedError

    def _lags(self) -> tuple[LoopLag, ...]:
        """The lag rules that apply: this loop's own, and any published to it (asked
        again whenever :attr:`lag` is set; a subclass with rules of its own calls
        :meth:`_lags_changed` once they are in place)."""
        return () if self._lag is None else (self._lag,)

    def _lags_changed(self) -> None:
        self._lag_rules = self._lags()

    def _flush(self, refused: Counter[tuple[str, str | None, str | None, str]]) -> None:
        """Count one iteration's refusals: (model, version, tenant, reason) → count."""
        raise NotImplementedError

    # -- the rule ----------------------------------------------------------------------

    def __call__(self, target: bytes, headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
        """Return the whole HTTP response refusing the request, or None to serve it.

        ``target`` is the request's URL as sent; ``headers`` its headers, names in
        lower case. Only ``POST`` requests are asked about. A ``headers`` sequence
        passed again (the same object: ``plain_head`` hands out one list for each kind
        of head it reads) must be unchanged: what it says is kept from the last call,
        not read again.
        """
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        # Decided once per epoch for each kind of request: under overload one event-loop
        # iteration refuses hundreds alike, and the model's state does not move between
        # them (the epoch here: a reading of the loop's clock, which counts milliseconds
        # under uvloop). The epoch, and whether to refuse at all, are asked when the
        # loop's clock has moved.
        now = loop.time()
        if now != self._now:
            self._now = now
            epoch = self._epoch(now)
            if epoch != self._decided_at:
                self._decided.clear()
                self._lag_refusals.clear()
                self._decided_at = epoch
                self._new_iteration()
            self._skipping = self._skip()
            if self._lag is not None and not self._skipping:
                self._lag.request_seen(loop)  # it keeps the time of the last
        if self._skipping:
            return None
        if headers is self._read_headers and target is self._read_target:
            key, tenant = self._read  # the same request again (a client's same head)
        else:
            key, tenant = self._read = read_kind(target, headers)
            self._read_headers, self._read_target = headers, target
        decision = self._decided.get(key)
        if decision is None:
            decision = self._decided[key] = self._decide(*key)
        if decision is _SERVE:
            return None
        assert isinstance(decision, _Decision)
        refused = None
        for index, rule in enumerate(self._lag_rules):
            # A rule admitting all (its shares at 1) is not asked: its credit stays.
            if rule.top_share >= 1.0 and (rule.share >= 1.0 or not decision.stated_lower):
                continue
            if decision.stated_lower:
                if not rule.admit():
                    refused = self._lag_refusal(index, "lower", rule)
                    break
            elif not rule.admit_top():
                refused = self._lag_refusal(index, "top", rule)
                break
        if refused is not None:
            counted = decision.counted(tenant, Shed.reason)
        else:
            refused = decision.refusal
            if refused is None:
                return None
            if decision.note is not None:
                decision.note()
            counted = decision.counted(tenant, decision.reason)
        return self._refuse(counted, refused)

    def _refuse(self, counted: _Counted, refused: tuple[Shed, bytes]) -> bytes:
        """Count ``refused`` under ``counted`` (this iteration's refusals); its bytes."""
        self.shed += 1
        self._refused_at = self._now
        if not self._uncounted:
            asyncio.get_running_loop().call_soon(self._count)
        self._uncounted[counted] += 1
        self._refused = refused
        return refused[1]

    def refusal(
        self, target: bytes, headers: Sequence[tuple[bytes, bytes]]
    ) -> tuple[int, bytes, dict[str, str]] | None:
        """The refusal as ``(status, body, headers)`` (as ``fast_infer.error_parts``
        makes them), or None to serve the request: for a front end that writes its
        own response."""
        from sordino.server.fast_infer import error_parts  # the HTTP app's; not at import

        refused = self.refusal_of(target, headers)
        return None if refused is None else error_parts(refused[0])

    def refusal_of(
        self, target: bytes, headers: Sequence[tuple[bytes, bytes]]
    ) -> tuple[Shed, bytes] | None:
        """The error refusing the request and its whole HTTP response, or None."""
        return None if self(target, headers) is None else self._refused

    def _decide(
        self, target: bytes, priority_value: bytes | None, timeout_value: bytes | None,
        tag: bytes | None,
    ) -> _Decision | object:  # fmt: skip
        """What a request with these headers gets now, but for the lag rule (applied to
        each request): :data:`_SERVE` if this path does not answer it at all."""
        named = self._targets[target]
        if named is None:
            return _SERVE  # not inference, or an odd name: the ordinary path answers it
        model_name, version = named
        route = self._route(model_name, version)
        if route is None or not route.eligible:
            return _SERVE
        settings = route.settings
        key = (target, priority_value, timeout_value, tag)
        chosen = self._chosen.get(key)
        if chosen is None or chosen.settings is not settings:
            chosen = self._choose(settings, priority_value, timeout_value, tag)
            if chosen is None:
                return _SERVE  # malformed: the ordinary path says what is wrong with it
            if len(self._chosen) >= _KEPT:
                self._chosen.clear()
            self._chosen[key] = chosen
        late = None
        if chosen.timeout_s is not None:
            late = route.late(chosen.priority, chosen.timeout_s)
        return _Decision(
            model_name, version, route.note, chosen.stated_lower,
            (late, refusal_response(late)) if late is not None else None,
        )  # fmt: skip

    def _choose(
        self, settings: QueueSettings, priority_value: bytes | None,
        timeout_value: bytes | None, tag: bytes | None,
    ) -> _Chosen | None:  # fmt: skip
        """The priority and deadline admission will give a request with these headers
        on a route with ``settings``; None if its priority header is malformed."""
        # Only a request that states its priority in X-Sordino-Priority is refused for
        # lag as a lower one: without it the body may say high. (A tag's rule is not
        # enough: tags predate this refusal, and their clients did not ask for it.) The
        # deadline rule takes the priority and the deadline admission will give, by
        # admission's own rules (the body has none yet: the headers, the tag's rule,
        # the model's defaults).
        try:
            priority = choose_priority(
                settings,
                self._rules,
                header=priority_value.decode("latin-1") if priority_value is not None else None,
                tag=tag.decode("latin-1") if tag is not None else None,
            )
        except SordinoError:
            return None
        try:
            timeout_s = choose_timeout(
                settings,
                header=timeout_value.decode("latin-1") if timeout_value is not None else None,
                priority=priority,
            )
        except SordinoError:
            timeout_s = None  # malformed: the ordinary path says what is wrong with it
        stated_lower = priority_value is not None and priority > 1
        return _Chosen(settings, priority, timeout_s, stated_lower)

    def _lag_refusal(self, index: int, kind: str, lag: LoopLag) -> tuple[Shed, bytes]:
        """The refusal for lag (``kind``: ``lower`` or ``top``), made once an iteration."""
        refusal = self._lag_refusals.get((index, kind))
        if refusal is not None:
            return refusal
        if kind == "lower":
            message = (
                f"the server is overloaded (its event loop runs {lag.last_lag_s * 1000:.0f} "
                f"ms late): requests below the highest priority are refused first, "
                f"{lag.share:.0%} of them admitted now (none while the highest is cut "
                f"too); retry later"
            )
        else:
            message = (
                f"the server is overloaded (its event loop runs {lag.last_lag_s * 1000:.0f} "
                f"ms late with every lower priority refused): {lag.top_share:.0%} of the "
                f"highest priority admitted now; retry later"
            )
        error = Shed(message, retry_after_s=1.0)
        refusal = self._lag_refusals[index, kind] = (error, refusal_response(error))
        return refusal

    def refusing(self) -> bool:
        """Whether a request was refused here in the last :data:`REFUSING_S`."""
        loop = self._loop
        return loop is not None and loop.time() - self._refused_at < REFUSING_S

    def _count(self) -> None:
        uncounted, self._uncounted = self._uncounted, Counter()
        self._flush(uncounted)


_SERVE = object()
"""A decision: the request is not this path's to refuse (the ordinary path reads it)."""


class ShedRoute(NamedTuple):
    """What the header rule reads of one model route, wherever it comes from (a tuple:
    one is made each epoch a route is asked about, at 1 in flight each request)."""

    settings: QueueSettings
    """The queue policy admission's rules read (levels, defaults, overrides)."""
    eligible: bool
    """Refusable from headers: no pipeline, no sequences, no result cache."""
    late: Callable[[int, float | None], Shed | None]
    """The scheduler's arrival rule: the refusal at this priority and deadline, or None."""
    note: Callable[[], None] | None
    """Counts one refusal on a ``late`` answer where the scheduler lives (None: elsewhere)."""


class _Decision:
    """What :meth:`HeaderShed._decide` found for one kind of request in one epoch
    (a plain class: made once an epoch, at 1 in flight once a request)."""

    __slots__ = ("_counted", "model", "note", "reason", "refusal", "stated_lower", "version")

    def __init__(
        self, model: str, version: str | None, note: Callable[[], None] | None,
        stated_lower: bool, refusal: tuple[Shed, bytes] | None,
    ) -> None:  # fmt: skip
        self.model = model
        self.version = version
        self.note = note
        self.stated_lower = stated_lower
        """Its ``X-Sordino-Priority`` names a level below the highest."""
        self.refusal = refusal
        """Its deadline cannot be met (the scheduler's rule): the error and the whole
        response refusing it; or None."""
        self.reason = refusal[0].reason if refusal is not None else ""
        self._counted: dict[tuple[str | None, str], _Counted] = {}

    def counted(self, tenant: str | None, reason: str) -> _Counted:
        """The key a refusal of this kind is counted under (made once, then reused)."""
        key = self._counted.get((tenant, reason))
        if key is None:
            key = self._counted[tenant, reason] = (self.model, self.version, tenant, reason)
        return key


_Counted = tuple[str, str | None, str | None, str]
"""(model, version as requested, tenant, reason): what a refusal is counted by."""
_Key = tuple[bytes, bytes | None, bytes | None, bytes | None]
"""(target, ``X-Sordino-Priority``, ``X-Sordino-Timeout``, ``X-Sordino-Tag``): a kind of request."""


def read_kind(target: bytes, headers: Sequence[tuple[bytes, bytes]]) -> tuple[_Key, str | None]:
    """What the rule reads of a request: its kind, and its tenant (None: none named)."""
    priority_value = tag = timeout_value = tenant = None
    for name, value in headers:
        if name == _PRIORITY:
            priority_value = value
        elif name == _TIMEOUT:
            timeout_value = value
        elif name == _TAG:
            tag = value
        elif name == _TENANT:
            tenant = value
    named = tenant.decode("latin-1") if tenant is not None else None
    return (target, priority_value, timeout_value, tag), named


class _Chosen(NamedTuple):
    """The priority and deadline admission's rules give one kind of request on a
    route whose queue policy is ``settings`` (kept while that object is the route's)."""

    settings: QueueSettings
    priority: int
    timeout_s: float | None
    stated_lower: bool


_KEPT = 256
"""Kinds of target and of headers remembered across epochs (all forgotten past it)."""


def _named(target: bytes) -> tuple[str, str | None] | None:
    """The model and version an inference target names, or None (not one, odd name)."""
    match = _INFER.fullmatch(target)
    if match is None:
        return None
    try:
        return match[1].decode("ascii"), (
            match[2].decode("ascii") if match[2] is not None else None
        )
    except UnicodeDecodeError:
        return None


def refusal_response(error: SordinoError) -> bytes:
    """The whole HTTP response refusing a request with ``error`` (503, Retry-After)."""
    body = encode_error(str(error))
    retry = retry_after_header(error) or "1"
    return (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\nretry-after: %s\r\n\r\n%s"
        % (len(body), retry.encode("ascii"), body)
    )
