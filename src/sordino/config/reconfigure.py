"""The ``reconfigure`` section: how a live configuration change is watched and undone.

After ``sordino reconfigure`` applies a new snapshot, the server compares each
model's p99 latency and error rate over ``verify_window`` after the change with the
same span before it; when the change made either worse by more than the margins below,
the previous snapshot comes back (unless the call said ``--no-rollback``).
"""

from __future__ import annotations

from pydantic import Field

from sordino.config.base import Section
from sordino.config.units import Duration

__all__ = ["MAX_VERIFY_WINDOW_S", "ReconfigureConfig"]

MAX_VERIFY_WINDOW_S = 3600.0
"""The longest verify window (1 h); no other change can be applied while one runs."""


class ReconfigureConfig(Section):
    """The verify window of hot reconfiguration and what counts as worse."""

    verify_window: Duration = Field(default=30.0, ge=0, le=MAX_VERIFY_WINDOW_S)
    """How long the effect of a change is watched before it is kept (at most 1h); 0 = keep
    at once."""
    p99_ratio: float = Field(default=1.5, gt=1.0, le=100.0)
    """p99 after / p99 before above this (and ``p99_margin_ms`` more) counts as worse."""
    p99_margin_ms: float = Field(default=20.0, ge=0, le=60_000.0)
    """A p99 rise smaller than this many milliseconds is never worse (noise)."""
    error_rate_margin: float = Field(default=0.02, ge=0, le=1)
    """An error-rate rise above this share of requests (0.02 = 2 points) counts as worse."""
    rollback: bool = True
    """Roll a worse change back; false keeps it and only reports (``--no-rollback``)."""
    history: int = Field(default=100, ge=1, le=10_000)
    """How many applied snapshots ``sordino config history`` keeps in memory."""
