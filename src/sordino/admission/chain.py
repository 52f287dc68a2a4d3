"""Admission: a chain of small callables run in order before a request is queued.

A link is ``(request, context) -> None``: it may fill in the context (the priority,
the deadline) or raise to refuse the request with an error that says why. New
policies (auth, tenant quotas, memory admission, cache lookup) add a link; none
edits the server.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sordino.datatypes import brief_repr
from sordino.errors import InvalidRequest, QueueTimeout, Unsupported
from sordino.inference import InferRequest
from sordino.records import QueueSettings

__all__ = [
    "ABSENT",
    "PRIORITY_HEADER",
    "TAG_HEADER",
    "TIMEOUT_HEADER",
    "AdmissionChain",
    "AdmissionContext",
    "Link",
    "choose_priority",
    "choose_timeout",
    "default_links",
    "parse_priority",
    "reject_unsupported_parameters",
    "resolve_priority",
    "resolve_timeout",
]

PRIORITY_NAMES = ("high", "normal", "low")
TAG_HEADER = "x-sordino-tag"
PRIORITY_HEADER = "x-sordino-priority"
"""The priority when ``parameters.priority`` is absent (read before the body: early_shed)."""
TIMEOUT_HEADER = "x-sordino-timeout"
"""The timeout in microseconds when ``parameters.timeout`` is absent."""
_INTEGER = re.compile(r"[+-]?[0-9]+")


@dataclass(slots=True)
class AdmissionContext:
    """What admission knows about the target model, and what it decided.

    ``priority_rules`` maps request tags to priorities (``stream_priority`` rules).
    Links fill ``priority`` (1 = highest) and ``timeout_s`` (None = no deadline).
    """

    model: str
    settings: QueueSettings
    priority_rules: Mapping[str, int | str]
    priority: int = 0
    timeout_s: float | None = None
    tenant: str = "default"
    """Who the request is (from its key when tenants are configured)."""
    slot: bool = False
    """True while the request holds a slot of its tenant's limits (admission/tenants.py)."""
    trial: bool = False
    """True when the request is the one trial of its tenant's half-open breaker."""


Link = Callable[[InferRequest, AdmissionContext], None]


class AdmissionChain:
    """Runs its links in order; the first to raise refuses the request."""

    def __init__(self, links: Sequence[Link]) -> None:
        self.links = list(links)

    def admit(self, request: InferRequest, context: AdmissionContext) -> AdmissionContext:
        """Run every link on ``request``; return the filled ``context``."""
        for link in self.links:
            link(request, context)
        return context


def parse_priority(value: object, settings: QueueSettings, source: str) -> int:
    """Turn a priority given as a number or as high/normal/low into a level.

    0 means the model's default level, as in Triton. A string may hold the number
    (ASCII digits, optionally signed). ``source`` names where the value came from,
    for the error message.
    """
    levels = settings.priority_levels
    if isinstance(value, str):
        text = value.strip()
        name = text.lower()
        if name == "high":
            return 1
        if name == "low":
            return levels
        if name == "normal":
            return settings.default_priority
        if not _INTEGER.fullmatch(text):
            raise InvalidRequest(
                f"{source} {brief_repr(value)} is not a priority: use a level 1..{levels} "
                "(1 is highest) or one of high, normal, low"
            )
        # Never int() thousands of digits (leading zeros count): past Python's limit it raises.
        digits = text.lstrip("+-").lstrip("0") or "0"
        if len(digits) > 18:
            raise _outside(source, brief_repr(value), levels)
        value = -int(digits) if text.startswith("-") else int(digits)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{source} must be an integer 1..{levels} or high/normal/low")
    if value == 0:
        return settings.default_priority
    if not 1 <= value <= levels:
        raise _outside(source, brief_repr(value), levels)
    return value


def _outside(source: str, shown: str, levels: int) -> InvalidRequest:
    return InvalidRequest(
        f"{source} {shown} is outside the model's priority levels 1..{levels} (1 is highest)"
    )


ABSENT: object = object()
"""A request-level value the request did not give (distinct from an explicit null)."""


def choose_priority(
    settings: QueueSettings,
    rules: Mapping[str, int | str],
    *,
    stated: object = ABSENT,
    header: str | None = None,
    tag: object = None,
) -> int:
    """The priority rule, the one place it lives: ``stated`` (``parameters.priority``),
    else ``header`` (``X-Sordino-Priority``), else the rule for ``tag``, else the model's
    default. Raises :class:`InvalidRequest` for a value that is not a priority.

    Admission applies it to a decoded request; ``server/early_shed.py`` to the headers
    alone, before the body is read, so the two never disagree.
    """
    if stated is not ABSENT:
        return parse_priority(stated, settings, "priority")
    if header is not None:
        return parse_priority(header, settings, f"header {PRIORITY_HEADER}")
    if tag is not None:
        if not isinstance(tag, str):
            raise InvalidRequest("parameter 'tag' must be a string")
        rule = rules.get(tag)
        if rule is not None:
            return parse_priority(rule, settings, f"priority rule for tag {tag!r}")
    return settings.default_priority


def choose_timeout(
    settings: QueueSettings,
    *,
    stated: object = None,
    header: str | None = None,
    priority: int = 0,
) -> float | None:
    """The deadline rule, the one place it lives: seconds from arrival, or None.

    ``stated`` is ``parameters.timeout`` (microseconds, Triton's name), else ``header``
    (``X-Sordino-Timeout``, same unit). A request may only shorten the model's default
    timeout, and only when the queue policy allows overrides; without a default, its
    own timeout applies. The policy is that of the request's ``priority`` level where
    the level has its own (``priority_queue_policy``). Raises :class:`InvalidRequest`
    for a malformed value.
    """
    if settings.levels:
        default_s, allow = settings.timeout_rule(priority)
    else:
        default_s, allow = settings.default_timeout_s, settings.allow_timeout_override
    default = default_s or None
    value = stated if stated is not None else _timeout_header(header)
    if value is None or not allow:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequest(
            "parameter 'timeout' must be a non-negative integer of microseconds, got "
            f"{brief_repr(value)}"
        )
    requested = value / 1e6 if value else None
    if requested is None:
        return default
    if default is None:
        return requested
    return min(requested, default)


def resolve_priority(request: InferRequest, context: AdmissionContext) -> None:
    """Priority from ``parameters.priority``, else the priority header, else the tag's rule.

    Else the model's default (:func:`choose_priority`).
    """
    params = request.parameters
    headers = request.headers
    context.priority = choose_priority(
        context.settings,
        context.priority_rules,
        stated=params.get("priority", ABSENT),
        header=headers.get(PRIORITY_HEADER),
        tag=params.get("tag") or headers.get(TAG_HEADER),
    )


def resolve_timeout(request: InferRequest, context: AdmissionContext) -> None:
    """The request's deadline (:func:`choose_timeout`), counted from its arrival.

    When the transport stamped ``request.received_at``, the time spent waiting to be
    read and decoded (an event loop behind under overload) is already gone: a request
    that waited past its deadline is refused (:class:`QueueTimeout`), one that waited
    less keeps the rest.
    """
    timeout_s = choose_timeout(
        context.settings,
        stated=request.parameters.get("timeout"),
        header=request.headers.get(TIMEOUT_HEADER),
        priority=context.priority,
    )
    if timeout_s and request.received_at is not None:
        waited = time.monotonic() - request.received_at
        if waited >= timeout_s:
            raise QueueTimeout(
                f"the request waited {waited * 1000:.0f} ms to be read, past its "
                f"{timeout_s * 1000:.0f} ms deadline; it was not run. The server "
                "is overloaded: retry later or raise the timeout"
            )
        timeout_s -= waited
    context.timeout_s = timeout_s


def _timeout_header(text: str | None) -> int | None:
    if text is None:
        return None
    text = text.strip()
    # Never int() thousands of digits; 15 digits of microseconds is over 30 years.
    if not text.isascii() or not text.isdigit() or len(text) > 15:
        raise InvalidRequest(
            f"header {TIMEOUT_HEADER} {brief_repr(text)} is not a timeout: give whole "
            "microseconds, as parameters.timeout"
        )
    return int(text)


_UNSUPPORTED_PARAMETERS = {
    "sequence_id": "sequence batching",
    "sequence_start": "sequence batching",
    "sequence_end": "sequence batching",
}


def reject_unsupported_parameters(request: InferRequest, context: AdmissionContext) -> None:
    """Refuse parameters that ask for features sordino does not implement."""
    parameters = request.parameters
    if not parameters:  # the common case
        return
    for name, feature in _UNSUPPORTED_PARAMETERS.items():
        value = parameters.get(name)
        if value not in (None, 0, False, ""):
            raise Unsupported(
                f"parameter {name!r} asks for {feature}, which model {request.model!r} is "
                "not configured for (a stateful model has a sequence_batching section); "
                "send the request without it"
            )


def default_links() -> list[Link]:
    """The links every request goes through, in order."""
    return [reject_unsupported_parameters, resolve_priority, resolve_timeout]
