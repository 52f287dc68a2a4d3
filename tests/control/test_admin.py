"""The admin API answers errors with the statuses of ``protocol/status.py``."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from sordino.clock import MonotonicClock
from sordino.control.admin import admin_routes
from sordino.errors import InvalidRequest, NotFound, QueueFull, SordinoError, Unavailable
from sordino.execution.faults import FaultSpec

TOKEN = "admin-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHAOS = {"target": "worker:m", "fault": "error"}


class RefusingChaos:
    """A chaos control whose every operation raises ``error``."""

    def __init__(self, error: SordinoError) -> None:
        self.error = error

    def inject_fault(
        self,
        target: str,
        kind: str,
        *,
        rate: float = 1.0,
        latency_s: float = 0.2,
        duration_s: float | None = None,
    ) -> FaultSpec:
        raise self.error

    @property
    def faults(self) -> Any:
        raise self.error


def _client(error: SordinoError) -> httpx.AsyncClient:
    """A client of the admin routes alone, in process, whose chaos control raises ``error``."""
    app = Starlette(routes=admin_routes(RefusingChaos(error), MonotonicClock(), TOKEN))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://admin")


async def test_unavailable_answers_503() -> None:
    """An Unavailable raised by an admin operation is a 503, as on every other endpoint."""
    async with _client(Unavailable("no worker can take a fault now")) as client:
        response = await client.post("/v2/admin/chaos", json=CHAOS, headers=AUTH)
    assert response.status_code == 503
    assert response.json() == {"error": "no worker can take a fault now"}


async def test_retry_after_is_sent_when_the_error_invites_a_retry() -> None:
    """A back-pressure error carries ``Retry-After`` here too."""
    async with _client(QueueFull("the queue is full", retry_after_s=0.2)) as client:
        response = await client.get("/v2/admin/chaos", headers=AUTH)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "1"


@pytest.mark.parametrize(
    ("error", "status"),
    [(NotFound("no model 'm' is loaded"), 404), (InvalidRequest("rate 'x' is not a number"), 400)],
)
async def test_client_mistakes_keep_their_status(error: SordinoError, status: int) -> None:
    """Unknown targets stay 404 and bad bodies 400."""
    async with _client(error) as client:
        response = await client.delete("/v2/admin/chaos", headers=AUTH)
    assert response.status_code == status
    assert response.json() == {"error": str(error)}


async def test_a_wrong_token_is_401_with_a_bearer_challenge() -> None:
    """The token check answers before any operation runs."""
    async with _client(NotFound("unused")) as client:
        response = await client.get("/v2/admin/chaos", headers={"Authorization": "Bearer nope"})
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert "error" in response.json()
