"""Bounded label values for strings a client chooses: model names and tenants.

A Prometheus series lives as long as the process, so a label value taken from a
request as it is lets any client grow ``/metrics`` (and the server's memory) without
limit: one series per made-up model name or tenant. :class:`MetricLabels` keeps the
set bounded: a model is labelled by its name only while it is loaded, a tenant only
when it is ``default`` or listed in ``telemetry.tenant_labels``; everything else is
counted under one label value, ``other``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

__all__ = ["DEFAULT_TENANT", "OTHER", "MetricLabels"]

OTHER = "other"
"""The label value of every model that is not loaded and every tenant not listed."""
DEFAULT_TENANT = "default"
"""The tenant of a request that names none."""


class MetricLabels:
    """Maps client-chosen model names and tenants to bounded label values.

    ``loaded`` says whether a model name is loaded now; ``tenants`` are the tenants
    labelled by name besides ``default``.
    """

    def __init__(self, loaded: Callable[[str], bool], tenants: Iterable[str] = ()) -> None:
        self._loaded = loaded
        self._tenants = frozenset(tenants) | {DEFAULT_TENANT}

    def model(self, name: str) -> str:
        """``name`` while it is loaded, else ``other``."""
        return name if self._loaded(name) else OTHER

    def tenant(self, tenant: str) -> str:
        """``tenant`` when it is ``default`` or configured, else ``other``."""
        return tenant if tenant in self._tenants else OTHER
