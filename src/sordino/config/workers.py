"""The ``workers`` section: how worker processes are watched, restarted and fed."""

from __future__ import annotations

from pydantic import Field

from sordino.config.base import Section
from sordino.config.units import Duration, Size, parse_size

__all__ = ["OutlierEjectionConfig", "WorkersConfig"]


class OutlierEjectionConfig(Section):
    """When an instance that keeps failing batches is taken out of placement.

    A batch the model fails on one instance is retried at once on another instance of
    the same device; when that one runs it, the failure was the first instance's own.
    ``consecutive_failures`` such failures in a row eject the instance for
    ``ejection_time``, twice as long for each further ejection in a row (up to
    ``max_ejection_time``); then it is offered batches again. The last serving
    instance of a device is never ejected. ``execution/outliers.py``.
    """

    enabled: bool = True
    """false: a failing instance keeps its share of batches (each failure retried once)."""
    consecutive_failures: int = Field(default=3, ge=1)
    """Failures of the instance's own, in a row, that eject it."""
    ejection_time: Duration = Field(default=1.0, gt=0)
    """How long the first ejection lasts; each further one in a row lasts twice as long."""
    max_ejection_time: Duration = Field(default=30.0, gt=0)
    """The cap of the ejection time."""
    restart_wait: Duration = Field(default=5.0, ge=0)
    """With no other instance to retry on, how long a batch failed by an instance that
    keeps failing waits for that instance to be replaced, to run there again — only
    where the guardian replaces it (a ``restart_worker`` trigger on the model); 0: it
    fails at once."""


class WorkersConfig(Section):
    """How worker processes are watched, restarted and fed."""

    heartbeat_timeout: Duration = 10.0
    """A worker silent this long is hung: it is killed, its batch retried, it is restarted."""
    execution_timeout: Duration = 60.0
    """Longest one batch may run in a worker before the worker is replaced (a thread
    instance: before the batch fails and it goes on in a new thread); 0 disables."""
    start_timeout: Duration = 120.0
    """Longest a worker (or a thread instance) may take to load its model and warm up."""
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
    nice: int = Field(default=10, ge=0, le=19)
    """How much lower than the server's the CPU priority of worker processes is (Unix
    ``nice``, added to the server's own): where the server and its workers want the same
    cores, the server's loop, which every request crosses, runs first. 0: the same
    priority as the server."""
    shared_memory: Size = Field(default=parse_size("256MB"), ge=4096)
    """Size of the shared-memory arena that tensors travel through."""
    outlier_ejection: OutlierEjectionConfig = OutlierEjectionConfig()
    """Taking an instance that keeps failing batches out of placement for a while."""
