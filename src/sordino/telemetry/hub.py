"""The telemetry hub of one runtime: series, resources, journal, forecasts, profiles,
bandwidth and busy shares (``utilisation.py``), clients' ratings (``feedback.py``).

The runtime creates one :class:`Telemetry` and passes it to every scheduler as an
observer (through :attr:`Telemetry.series`). A ticker task closes each wall-clock
second: it samples resources, turns the second's buckets into rows, and hands them
to the journal's queue. Nothing here blocks the request path: observers only append
to in-memory buckets, and SQLite and the forecast fit run on their own threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from sordino.clock import Clock
from sordino.config import TelemetryConfig
from sordino.events import Event, EventSink
from sordino.inference import ModelKey
from sordino.records import SchedulerStatistics
from sordino.telemetry.availability import AvailabilityTally
from sordino.telemetry.collectors import TelemetryCollector, TelemetryView
from sordino.telemetry.feedback import Feedback, RecentRequests
from sordino.telemetry.forecast import Forecast, forecast_from_journal
from sordino.telemetry.journal import Journal
from sordino.telemetry.journal_reader import MissingJournal
from sordino.telemetry.labels import MetricLabels
from sordino.telemetry.profile_data import OperatorProfile
from sordino.telemetry.resources import ResourceSampler
from sordino.telemetry.series import SeriesRecorder
from sordino.telemetry.utilisation import JOURNAL_EVERY_S, UtilisationMeter, utilisation_payload

__all__ = ["SLO_WINDOW_S", "Telemetry"]

log = logging.getLogger("sordino.telemetry")

SLO_WINDOW_S = 60


class Telemetry:
    """Everything telemetry keeps about one runtime, beside the request path."""

    def __init__(
        self,
        config: TelemetryConfig,
        *,
        events: EventSink,
        registry: CollectorRegistry,
        models: Callable[[], Iterable[SchedulerStatistics]],
        instances: Callable[[ModelKey], int],
        slo_s: Callable[[ModelKey], float],
        clock: Clock,
        labels: MetricLabels,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.config = config
        self.labels = labels
        self.events = events
        self.clock = clock
        self._wall = wall
        self._slo_s = slo_s
        self.started_at = wall()
        self.series = SeriesRecorder(
            models=models,
            instances=instances,
            slo_s=slo_s,
            wall=wall,
            window_s=int(config.recent_window),
        )
        self.resources = ResourceSampler()
        # Accepted requests by priority and outcome, journaled every 10 s (straight to the
        # journal: bookkeeping, kept out of the event sink's recent events and the dashboard).
        self.availability = AvailabilityTally(self._journal_only, wall=wall)
        # Bandwidth and per-instance busy share (the runtime points it at the executor).
        self.utilisation = UtilisationMeter()
        self._unjournaled = 0
        # User satisfaction: the recent requests that carried an id (a scheduler observer)
        # and the ratings clients post for them (journaled as ``feedback`` events).
        self.recent_requests = RecentRequests(wall=wall)
        self.feedback = Feedback(self._journal_only, requests=self.recent_requests, wall=wall)
        self.journal: Journal | None = None
        self.forecast: Forecast | None = None
        self.profiles: dict[str, OperatorProfile] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._requests = Counter(
            "sordino_tenant_requests",
            "Requests by model, tenant, priority level and outcome (rejected = refused "
            "before queueing).",
            ["model", "tenant", "priority", "outcome"],
            registry=registry,
        )
        self._request_children: dict[tuple[str, str, int, str], Any] = {}
        registry.register(TelemetryCollector(self.view))

    def _journal_only(self, kind: str, subject: str, cause: str = "", **payload: Any) -> None:
        if self.journal is not None:
            self.journal.write_event(Event(kind, subject, cause, payload, time=self._wall()))

    # -- lifecycle -------------------------------------------------------------------

    def open_journal(self, path: Path) -> Journal:
        """Journal series and events to ``path`` from now on (call before ``start``)."""
        journal = Journal(
            path,
            retention_s=self.config.retention,
            flush_interval_s=self.config.flush_interval,
            wall=self._wall,
        )
        journal.open()
        self.journal = journal
        self.series.subscribe(journal.write_rows)
        self.events.subscribe(journal.write_event)
        return journal

    async def start(self) -> None:
        """Start the per-second ticker (and the forecaster when a journal is open)."""
        loop = asyncio.get_running_loop()
        # The copy bandwidth saturation is measured against: a few milliseconds, once.
        await loop.run_in_executor(None, self.utilisation.probe)
        self._tasks.append(loop.create_task(self._tick(), name="sordino-telemetry-tick"))
        if self.journal is not None and self.config.forecast:
            self._tasks.append(loop.create_task(self._forecast(), name="sordino-forecast"))

    async def stop(self) -> None:
        """Close the current second, stop the tasks, commit and close the journal."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        self.series.close_until(int(self._wall()) + 1, self.resources.sample())
        self.availability.flush()
        self._journal_utilisation()
        if self.journal is not None:
            journal, self.journal = self.journal, None
            await asyncio.get_running_loop().run_in_executor(None, journal.close)

    async def _tick(self) -> None:
        while True:
            now = self._wall()
            # Wake just after the second boundary, so the closed second is complete.
            await self.clock.sleep(math.floor(now) + 1.02 - now)
            try:
                self.series.close_until(int(self._wall()), self.resources.sample())
                self.availability.flush(self._wall())
                if self.utilisation.tick(self._wall()) is not None:
                    self._unjournaled += 1
                    if self._unjournaled >= JOURNAL_EVERY_S:
                        self._journal_utilisation()
                self._keep_marks()
            except Exception:  # telemetry must never take the server down
                log.exception("closing a telemetry second failed")

    def _journal_utilisation(self) -> None:
        """Journal the means of the seconds sampled since the last ``utilisation`` event."""
        count, self._unjournaled = self._unjournaled, 0
        if count:
            payload = utilisation_payload(self.utilisation.recent(count))
            self._journal_only("utilisation", "runtime", "", **payload)

    def _keep_marks(self) -> None:
        """Show the marks ``sordino event mark`` journaled among the recent events."""
        journal = self.journal
        if journal is None:
            return
        while not journal.written_elsewhere.empty():
            self.events.keep(journal.written_elsewhere.get_nowait())

    async def _forecast(self) -> None:
        journal = self.journal
        assert journal is not None
        try:
            import statsmodels  # noqa: F401
        except ImportError:
            log.info("no forecasts: statsmodels is not installed (pip install statsmodels)")
            return
        loop = asyncio.get_running_loop()
        while True:
            try:
                self.forecast = await loop.run_in_executor(
                    None, forecast_from_journal, journal.path
                )
            except MissingJournal as exc:  # damaged, or set aside a moment ago
                log.warning("no forecast this time: %s", exc)
            except Exception:
                log.exception("forecast from %s failed", journal.path)
            interval = self.config.forecast_interval
            if self.forecast is None or self.forecast.short:
                # Still short of history: look again each minute, so the forecast (and
                # the "needs N more minutes" count) follows the history as it grows.
                interval = min(interval, 60.0)
            await self.clock.sleep(interval)

    # -- recording -------------------------------------------------------------------

    def request_rejected(
        self, model: ModelKey | None, name: str, reason: str, count: int = 1
    ) -> None:
        """Count ``count`` requests for ``name`` refused before acceptance for ``reason``.

        ``model`` is the loaded model they asked for (None when none is loaded by that
        name: such requests are not given a series of their own). The per-second series
        and the availability tally count them, so that the monitor, diagnose and the
        postmortem show client errors and refusals beside the accepted requests.
        """
        if model is None:
            return
        self.series.rejected(model, reason, count)
        self.availability.rejected(model.name, reason, count)

    def request_finished(
        self, model: str, tenant: str, priority: int, outcome: str, count: int = 1
    ) -> None:
        """Count one request (or ``count`` alike) by model, tenant, priority and outcome.

        ``model`` and ``tenant`` are what the client sent; they are labelled through
        :class:`MetricLabels` (``other`` for a model not loaded or a tenant not listed).
        """
        key = (self.labels.model(model), self.labels.tenant(tenant), priority, outcome)
        child = self._request_children.get(key)
        if child is None:
            # prometheus_client's labels() validates and locks on every call; its child
            # for a label set never changes, so it is looked up once (issue 16). The label
            # values are bounded by MetricLabels, so is this cache.
            level = str(priority) if priority else "-"
            child = self._requests.labels(key[0], key[1], level, outcome)
            self._request_children[key] = child
        child.inc(count)

    def record_profile(self, profile: OperatorProfile) -> None:
        """Keep ``profile`` as the model's latest and journal it as an event."""
        self.profiles[profile.model] = profile
        top = profile.top(3)
        self.events.emit(
            "operator_profile",
            f"{profile.model}/{profile.version}",
            "profile requested"
            + (f": top {top[0].op} {top[0].share:.0%}" if top else ": no operators ran"),
            **profile.to_json(),
        )

    # -- reading ---------------------------------------------------------------------

    def slo_attainment(self) -> dict[tuple[str, str], tuple[float, float | None]]:
        """Per model: (SLO target in seconds, share of the last minute within it or None)."""
        out: dict[tuple[str, str], tuple[float, float | None]] = {}
        for key, rows in self.series.recent(SLO_WINDOW_S).items():
            total = sum(r.requests for r in rows)
            met = sum(r.slo_met for r in rows)
            out[(key.name, key.version)] = (self._slo_s(key), met / total if total else None)
        return out

    def view(self) -> TelemetryView:
        """The records the Prometheus collector exports."""
        last = [rows[-1] for rows in self.series.recent(1).values() if rows]
        return TelemetryView(
            last_rows=last,
            slo=self.slo_attainment(),
            resources=self.resources.last(),
            forecast=self.forecast,
            utilisation=self.utilisation.last(),
            profiles=dict(self.profiles),
            journal=self.journal.statistics() if self.journal is not None else None,
        )
