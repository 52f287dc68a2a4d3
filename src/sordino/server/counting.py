"""Counting the requests the server did not serve: each exactly once, as ``rejected``.

A request the transport could not read or decode (a bad body, an unknown model, the
client gone mid-body, a server fault) is counted by :class:`Arrival`, the context
manager a transport wraps the reading in; one refused by validation, admission or
the queue by :meth:`Rejections.refused`; requests refused unread (from their headers)
by :meth:`Rejections.count`, in bulk. Each goes to ``sordino_requests_total`` and the
per-tenant family with the reason, and to the Triton statistics of a loaded model.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from sordino.errors import Cancelled, SordinoError
from sordino.inference import InferRequest, ModelKey
from sordino.server.registry import ModelRegistry
from sordino.telemetry.hub import Telemetry
from sordino.telemetry.metrics import Metrics

__all__ = ["INTERNAL", "Arrival", "Rejections", "reason_of", "request_tenant"]

INTERNAL = "internal"
"""The reason counted for a request that ended on an unexpected exception (a 500)."""


def reason_of(exc: BaseException) -> str | None:
    """The reason a request that ended on ``exc`` is counted with; None if it is not a
    request's end (``GeneratorExit``, ``KeyboardInterrupt``)."""
    if isinstance(exc, SordinoError):
        return exc.reason
    if isinstance(exc, asyncio.CancelledError):
        return Cancelled.reason
    if isinstance(exc, Exception):
        return INTERNAL
    return None


class Rejections:
    """Counts requests that were not served, by model, tenant and reason."""

    __slots__ = ("_metrics", "_registry", "_telemetry")

    def __init__(self, registry: ModelRegistry, metrics: Metrics, telemetry: Telemetry) -> None:
        self._registry = registry
        self._metrics = metrics
        self._telemetry = telemetry

    def refused(self, request: InferRequest, reason: str) -> None:
        """Release a refused ``request``'s tensors and count it once."""
        request.release()
        self.count(request.model, request.version, request_tenant(request), reason)

    def count(
        self, model: str, version: str | None, tenant: str | None, reason: str, count: int = 1
    ) -> None:
        """Count ``count`` requests to ``model`` refused for ``reason``."""
        # Only a loaded version is a label value; an unknown one is the client's string.
        versions = self._registry.versions(model)
        if version:
            served = version if version in versions else ""
        else:
            served = versions[-1] if versions else ""
        self._metrics.request_rejected(model, reason, version=served, count=count)
        self._telemetry.request_finished(model, tenant or "default", 0, "rejected", count)
        loaded = ModelKey(model, served) if served else None
        self._telemetry.request_rejected(loaded, model, reason, count)


class Arrival:
    """What a transport knows of a request it is still reading: whom to count it for.

    The context manager :meth:`InferenceService.receiving` returns (a class, not a
    generator: it wraps every request on the hot path). Whatever ends the request
    inside it is counted once as ``rejected`` and raised on.
    """

    __slots__ = ("_rejections", "model", "tenant", "version")

    def __init__(
        self, rejections: Rejections, model: str, version: str | None, tenant: str | None
    ) -> None:
        self._rejections = rejections
        self.model = model
        self.version = version
        self.tenant = tenant

    def __enter__(self) -> Arrival:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        reason = reason_of(exc)
        if reason is not None:
            self._rejections.count(self.model, self.version, self.tenant, reason)


def request_tenant(request: InferRequest) -> str:
    """The tenant ``request`` is served for (what quotas and shared-memory regions key on):
    the authenticated one once known, else the one it names, else ``default``."""
    if request.tenant is not None:
        return request.tenant
    tenant = request.parameters.get("tenant") or request.headers.get("x-sordino-tenant")
    return tenant if isinstance(tenant, str) and tenant else "default"
