"""The ``telemetry`` section: the time series, its SQLite journal, and forecasts."""

from __future__ import annotations

from pydantic import Field

from sordino.config.base import Section
from sordino.config.units import Duration

__all__ = ["TelemetryConfig"]


class TelemetryConfig(Section):
    """The per-second time series, the SQLite journal under ``server.data_dir``, forecasts."""

    journal: bool = True
    """Record the time series and events in ``<data_dir>/<journal_file>`` (SQLite, WAL)."""
    journal_file: str = Field(default="journal.sqlite3", min_length=1)
    """File name of the journal inside ``server.data_dir``."""
    retention: Duration = Field(default=7 * 86400.0, gt=0)
    """How long journal rows are kept; older ones are pruned in the background."""
    flush_interval: Duration = Field(default=1.0, gt=0, le=10)
    """How often the journal writer commits; a crash loses at most this much."""
    recent_window: Duration = Field(default=900.0, ge=60)
    """How much of the series is kept in memory for /dashboard and ``sordino monitor``."""
    forecast: bool = True
    """Forecast the next hour's QPS and memory from the journal (needs statsmodels)."""
    forecast_interval: Duration = Field(default=300.0, ge=10)
    """How often the forecast is refitted."""
    tenant_labels: tuple[str, ...] = Field(default=(), max_length=1000)
    """Tenants counted under their own name in sordino_tenant_requests_total; any other
    tenant but ``default`` is counted as ``other``, so clients cannot add series."""
