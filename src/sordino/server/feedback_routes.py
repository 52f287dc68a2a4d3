"""``POST /v2/feedback``: a client rates a request it was answered (the business layer).

The body is ``{"request_id": "<the inference request's id>", "rating": 1-5}`` or
``{"tag": "<a label of the client's>", "rating": 1-5}``; the answer is the rating as
recorded, with the rated request's latency, outcome and degradation. Validation,
the recent-request rule (404), one rating per request (409) and the per-client rate
(429) are :class:`~sordino.telemetry.feedback.Feedback`'s; errors map as everywhere.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.server.http_routes import json_body
from sordino.server.runtime import Runtime

__all__ = ["feedback_routes"]

Handler = Callable[[Request], Awaitable[Response]]


def feedback_routes(
    runtime: Runtime,
    guard: Callable[[Handler], Handler],
    json: Callable[[object], Response],
) -> list[Route]:
    """The feedback route; ``guard`` maps errors as ``http.py`` does."""

    async def feedback(request: Request) -> Response:
        """Rate a recent request (by its id) or a tag from 1 to 5."""
        body = await json_body(request)
        client = request.client.host if request.client is not None else "unknown"
        rating = runtime.telemetry.feedback.rate(body, client=client)
        facts = rating.request
        return json(
            {
                "rating": rating.rating,
                "request_id": rating.request_id,
                "tag": rating.tag,
                "request": None
                if facts is None
                else {
                    "model": facts.model,
                    "version": facts.version,
                    "latency_ms": facts.latency_ms,
                    "outcome": facts.outcome,
                    "degraded": facts.degraded,
                },
            }
        )

    return [Route("/v2/feedback", guard(feedback), methods=["POST"])]
