"""The ``workers`` section: how worker processes are watched, restarted and fed."""

from __future__ import annotations

from pydantic import Field

from sordino.config.base import Section
from sordino.config.units import Duration, Size, parse_size

__all__ = ["WorkersConfig"]


class WorkersConfig(Section):
    """How worker processes are watched, restarted and fed."""

    heartbeat_timeout: Duration = 10.0
    """A worker silent this long is hung: it is killed, its batch retried, it is restarted."""
    execution_timeout: Duration = 60.0
    """Longest one batch may run in a worker before the worker is replaced; 0 disables."""
    start_timeout: Duration = 120.0
    """Longest a worker may take to load its model and warm up."""
    restart_backoff: Duration = 1.0
    """Delay before restarting a worker that failed while starting or before it was
    healthy (a crash loop); it doubles on each further such failure in a row. A healthy
    worker that fails is restarted at once."""
    restart_backoff_max: Duration = 60.0
    """The cap of the restart delay."""
    restart_backoff_reset: Duration = 30.0
    """A worker up this long is healthy: if it fails, it restarts at once and the
    backoff starts over."""
    restart_backoff_reset_batches: int = Field(default=10, ge=1)
    """A worker that ran this many batches is healthy (as after ``restart_backoff_reset``)."""
    warmup_batches: int = Field(default=1, ge=0)
    """Dummy batches a (re)started worker runs before it takes traffic."""
    shared_memory: Size = Field(default=parse_size("256MB"), ge=4096)
    """Size of the shared-memory arena that tensors travel through."""
