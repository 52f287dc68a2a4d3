"""The per-second time series: one row per second per model, one per second for resources.

:class:`SeriesRecorder` is a :class:`~sordino.scheduling.scheduler.SchedulerObserver`:
requests and batches land in the bucket of the wall-clock second they finish in.
:meth:`SeriesRecorder.close_until` turns every bucket of a past second into a
:class:`SecondRow` (zero rows for seconds without traffic, so charts have no holes),
keeps the last ``window_s`` rows in memory for the dashboard and the monitor, and
hands them to listeners (the journal). Closing is driven by the telemetry hub's
ticker, never by the request path.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

from sordino.inference import ModelKey
from sordino.records import BatchDone, RequestDone, SchedulerStatistics
from sordino.telemetry.availability import rejection_class as _kind
from sordino.telemetry.resources import ResourceSample

__all__ = ["ResourceRow", "SecondRow", "SeriesRecorder", "SeriesStatistics"]

# A ticker that wakes after a long stall fills at most this many seconds of zero rows.
_MAX_GAP_S = 120

log = logging.getLogger("sordino.telemetry")


@dataclass(frozen=True, slots=True)
class SecondRow:
    """What one model did during the wall-clock second ``[t, t + 1)``.

    Latencies are milliseconds over the requests that finished in that second
    (``None`` when none did); ``requests`` counts every finished request, so it is
    the QPS. ``busy`` is the share of the model's instances' time spent computing.
    """

    t: int
    model: str
    version: str
    requests: int
    errors: int
    errors_by_reason: dict[str, int]
    p50_ms: float | None
    p99_ms: float | None
    queue_ms: float | None
    compute_ms: float | None
    batches: int
    batch_size: float | None
    queue_depth: int
    busy: float
    slo_met: int
    fragmentation: float | None = None
    temperature_c: float | None = None
    rejected_by_reason: dict[str, int] = field(default_factory=dict)
    """Requests refused before acceptance in that second, and those a model answered
    with an error of the client's kind (``model_rejected``), by reason (not in
    ``requests``)."""

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def client_errors(self) -> int:
        """Requests refused as the client's mistake (4xx but 429: bad input, unknown model)."""
        return sum(n for r, n in self.rejected_by_reason.items() if _kind(r) == "client_error")

    @property
    def refused(self) -> int:
        """Requests the server would not take (503 shed, queue full, not ready; 429)."""
        return sum(n for r, n in self.rejected_by_reason.items() if _kind(r) == "refused")

    @property
    def received(self) -> int:
        """Every request that ended in that second, refused before acceptance or not."""
        return self.requests + sum(self.rejected_by_reason.values())


@dataclass(frozen=True, slots=True)
class ResourceRow:
    """The process and device figures sampled at the end of second ``t``."""

    t: int
    rss_bytes: int
    cpu_percent: float
    pool_reserved_bytes: int | None
    pool_in_use_bytes: int | None
    fragmentation: float | None
    cpu_temp_c: float | None
    gpu_memory_used_bytes: int | None
    gpu_temp_c: float | None
    gpu_power_w: float | None

    @classmethod
    def from_sample(cls, t: int, sample: ResourceSample) -> ResourceRow:
        used = [g.memory_used_bytes for g in sample.gpus if g.memory_used_bytes is not None]
        temps = [g.temperature_c for g in sample.gpus if g.temperature_c is not None]
        power = [g.power_w for g in sample.gpus if g.power_w is not None]
        return cls(
            t=t,
            rss_bytes=sample.rss_bytes,
            cpu_percent=sample.cpu_percent,
            pool_reserved_bytes=sample.pool_reserved_bytes,
            pool_in_use_bytes=sample.pool_in_use_bytes,
            fragmentation=sample.fragmentation,
            cpu_temp_c=sample.cpu_temp_c,
            gpu_memory_used_bytes=sum(used) if used else None,
            gpu_temp_c=max(temps) if temps else None,
            gpu_power_w=sum(power) if power else None,
        )


@dataclass(frozen=True, slots=True)
class SeriesStatistics:
    """How much the recorder holds and has produced."""

    models: int
    open_buckets: int
    rows_closed: int
    last_closed: int | None


@dataclass(slots=True)
class _Bucket:
    latencies: list[float] = field(default_factory=list)
    queue_s: float = 0.0
    compute_s: float = 0.0
    successes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    batches: int = 0
    rows: int = 0
    busy_s: float = 0.0
    max_depth: int = 0
    slo_met: int = 0
    rejected: dict[str, int] = field(default_factory=dict)


RowListener = Callable[[list[SecondRow], ResourceRow | None], None]


class SeriesRecorder:
    """Buckets request and batch outcomes by wall-clock second and model.

    ``models`` lists the loaded models (their scheduler statistics) so seconds
    without traffic still get a row; ``instances`` says how many batches of a model
    can run at once (for the busy fraction); ``slo_s`` gives a model's latency target.
    """

    def __init__(
        self,
        *,
        models: Callable[[], Iterable[SchedulerStatistics]],
        instances: Callable[[ModelKey], int],
        slo_s: Callable[[ModelKey], float],
        wall: Callable[[], float] = time.time,
        window_s: int = 900,
    ) -> None:
        self._models = models
        self._instances = instances
        self._slo_s = slo_s
        self._wall = wall
        self._window = window_s
        self._buckets: dict[tuple[ModelKey, int], _Bucket] = {}
        self._rows: dict[ModelKey, deque[SecondRow]] = {}
        self._resources: deque[ResourceRow] = deque(maxlen=window_s)
        self._listeners: list[RowListener] = []
        self._last_closed: int | None = None
        self._closed = 0

    def subscribe(self, listener: RowListener) -> None:
        """Call ``listener(rows, resource_row)`` with every closed second."""
        self._listeners.append(listener)

    def _bucket(self, model: ModelKey) -> _Bucket:
        key = (model, int(self._wall()))
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket()
        return bucket

    # -- SchedulerObserver -----------------------------------------------------------

    def request_done(self, done: RequestDone) -> None:
        bucket = self._bucket(done.model)
        if done.outcome == "success":
            bucket.successes += 1
            bucket.latencies.append(done.total_s)
            bucket.queue_s += done.queue_s
            bucket.compute_s += done.compute_s
            if done.total_s <= self._slo_s(done.model):
                bucket.slo_met += 1
        elif done.outcome == "failure":
            if _kind(done.reason) == "client_error":
                # The model answered it with an error of the client's kind (a 4xx): the
                # caller's mistake, counted as a refused bad request is, not an error.
                bucket.rejected[done.reason] = bucket.rejected.get(done.reason, 0) + 1
            else:
                bucket.errors[done.reason] = bucket.errors.get(done.reason, 0) + 1

    def rejected(self, model: ModelKey, reason: str, count: int = 1) -> None:
        """Count ``count`` requests for a loaded ``model`` refused before acceptance."""
        bucket = self._bucket(model)
        bucket.rejected[reason] = bucket.rejected.get(reason, 0) + count

    def batch_done(self, done: BatchDone) -> None:
        bucket = self._bucket(done.model)
        bucket.batches += 1
        bucket.rows += done.rows
        bucket.busy_s += done.input_s + done.infer_s + done.output_s

    def queue_changed(self, model: ModelKey, depth: int) -> None:
        bucket = self._bucket(model)
        bucket.max_depth = max(bucket.max_depth, depth)

    # -- closing seconds -------------------------------------------------------------

    def close_until(self, now_s: int, resources: ResourceSample | None = None) -> list[SecondRow]:
        """Close every second before ``now_s``; return the new rows, oldest first."""
        if self._last_closed is not None and now_s - 1 < self._last_closed:
            self._clock_went_back(now_s)
        first = now_s - 1 if self._last_closed is None else self._last_closed + 1
        first = max(first, now_s - _MAX_GAP_S)
        stats = {ModelKey(s.model, s.version): s for s in self._models()}
        fragmentation = resources.fragmentation if resources is not None else None
        temperature = resources.device_temp_c if resources is not None else None
        out: list[SecondRow] = []
        for second in range(first, now_s):
            batch: list[SecondRow] = []
            keys = set(stats) | {key for key, t in self._buckets if t == second}
            for key in sorted(keys, key=lambda k: (k.name, k.version)):
                bucket = self._buckets.pop((key, second), None) or _Bucket()
                depth = stats[key].queue.depth if key in stats else 0
                row = self._row(second, key, bucket, depth, fragmentation, temperature)
                self._rows.setdefault(key, deque(maxlen=self._window)).append(row)
                batch.append(row)
            resource_row = (
                ResourceRow.from_sample(second, resources)
                if resources is not None and second == now_s - 1
                else None
            )
            if resource_row is not None:
                self._resources.append(resource_row)
            for listener in self._listeners:
                listener(batch, resource_row)
            out += batch
        # Buckets of seconds already closed (a request finishing exactly at a boundary
        # after its second was closed) are dropped rather than left to grow.
        for stale_bucket in [k for k in self._buckets if k[1] < now_s]:
            del self._buckets[stale_bucket]
        self._last_closed = max(now_s - 1, self._last_closed or now_s - 1)
        self._closed += len(out)
        # An unloaded model's rows are forgotten once they have all left the window.
        stale = now_s - self._window
        for key in [k for k, rows in self._rows.items() if k not in stats and rows[-1].t < stale]:
            del self._rows[key]
        return out

    def _clock_went_back(self, now_s: int) -> None:
        """The wall clock was set back (a step of NTP, a host's clock corrected): go on
        from the new time. Waiting for it to reach the last closed second instead
        dropped every request of the meantime — an hour of series, and of the
        guardian's windows, for an hour's step. The rows of seconds now in the future
        leave the in-memory windows; the journal's rows of those seconds are replaced
        as they close again."""
        assert self._last_closed is not None
        log.warning(
            "the wall clock went back (by %d s at least): the per-second series goes on "
            "from the new time (the journal's rows of the seconds it repeats are written "
            "again)",
            self._last_closed + 1 - now_s,
        )
        cut = now_s - 1
        for future in [k for k in self._buckets if k[1] > now_s]:
            del self._buckets[future]
        for key, rows in self._rows.items():
            self._rows[key] = deque((r for r in rows if r.t < cut), maxlen=rows.maxlen)
        kept = [r for r in self._resources if r.t < cut]
        self._resources = deque(kept, maxlen=self._resources.maxlen)
        self._last_closed = None

    def _row(
        self,
        second: int,
        key: ModelKey,
        bucket: _Bucket,
        depth: int,
        fragmentation: float | None,
        temperature: float | None,
    ) -> SecondRow:
        errors = sum(bucket.errors.values())
        p50 = p99 = None
        if bucket.latencies:
            p50, p99 = (float(v) * 1000 for v in np.percentile(bucket.latencies, [50, 99]))
        n = bucket.successes
        return SecondRow(
            t=second,
            model=key.name,
            version=key.version,
            requests=n + errors,
            errors=errors,
            errors_by_reason=dict(bucket.errors),
            p50_ms=p50,
            p99_ms=p99,
            queue_ms=bucket.queue_s / n * 1000 if n else None,
            compute_ms=bucket.compute_s / n * 1000 if n else None,
            batches=bucket.batches,
            batch_size=bucket.rows / bucket.batches if bucket.batches else None,
            queue_depth=max(bucket.max_depth, depth),
            busy=min(1.0, bucket.busy_s / max(1, self._instances(key))),
            slo_met=bucket.slo_met,
            fragmentation=fragmentation,
            temperature_c=temperature,
            rejected_by_reason=dict(bucket.rejected),
        )

    # -- reading ---------------------------------------------------------------------

    def recent(self, seconds: int | None = None) -> dict[ModelKey, list[SecondRow]]:
        """The kept rows of every model, oldest first (the last ``seconds`` when given)."""
        out = {}
        for key, rows in self._rows.items():
            kept = list(rows)
            out[key] = kept[-seconds:] if seconds else kept
        return out

    def recent_resources(self, seconds: int | None = None) -> list[ResourceRow]:
        kept = list(self._resources)
        return kept[-seconds:] if seconds else kept

    def statistics(self) -> SeriesStatistics:
        return SeriesStatistics(
            models=len(self._rows),
            open_buckets=len(self._buckets),
            rows_closed=self._closed,
            last_closed=self._last_closed,
        )
