"""The guardian's control loop: detect, act, verify, roll back, record.

Every ``self_healing.interval`` (500 ms) the loop reads the hub's in-memory series
(:class:`~sordino.telemetry.series.SeriesRecorder`, never the journal) and, for each
trigger:

1. **Detect**: measure the metric over the trigger's window, counting only seconds
   after the trigger's last action (so an action is judged, and fires again, only on
   data it could have influenced); the window must be full.
2. **Act**: when the threshold holds, the cooldown since the trigger's last action has
   passed, the hourly budget has room and no running action holds the same control,
   the trigger's next action is applied (in the background; the loop goes on).
3. **Record**: as soon as the action is applied, its diagnostic record is emitted (an
   event of kind ``guardian`` with ``phase: "acted"`` and ``verify: "pending"``; every
   record goes to the alert channels too), so the journal, the postmortem and the alert
   channels know of the action when it happens, not a verify window later.
4. **Verify**: ``verify_window`` after the action, the metric over the seconds since
   then is judged: ``cleared``, ``not cleared`` or ``worse`` (also ``worse`` when a
   configuration change made the model's p99 latency 50 % and 20 ms worse while its
   request rate did not rise by more than 20 %: a p99 that grew with the load is the
   load's; and never ``worse`` for a ``qps`` trigger's own metric, since demand is not
   something an action makes worse). The verdict is appended then: a second
   ``guardian`` record with ``phase: "verdict"`` and the same ``action_id``, which
   readers merge into the first (the postmortem counts the action once).
5. **Escalate / roll back**: ``not cleared`` or ``worse`` moves the trigger to its
   next action; a ``worse`` configuration change is reverted at once when
   ``recovery.rollback_on_failure``. A change that cleared the condition is kept until
   the condition has stayed clear (inside the threshold by the trigger's hysteresis)
   for the cooldown, then reverted (a record with ``phase: "reverted"`` says so).

The trigger state lives in ``triggers.py``; the records are written by
:class:`~sordino.guardian.records.ActionRecorder` (``records.py``).

Time comes from the injected :class:`~sordino.clock.Clock` (cooldowns, verify windows,
the budget) and the ``wall`` callable (which seconds of the series to read), so the
cooldown and budget properties are tested on virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from sordino.clock import Clock
from sordino.config.self_healing import ActionSpec, SelfHealingConfig
from sordino.config.threshold import Threshold, parse_threshold
from sordino.events import EventSink
from sordino.guardian.actions import Action, Applied
from sordino.guardian.alerts import AlertSender
from sordino.guardian.metrics import Measure, Timings, describe_value, measure
from sordino.guardian.records import REVERTED, ActionRecorder, span
from sordino.guardian.triggers import RunningAction, TriggerState
from sordino.inference import ModelKey
from sordino.records import GuardianStatistics, TriggerStatistics
from sordino.telemetry.series import ResourceRow, SecondRow, SeriesStatistics

__all__ = ["Guardian", "SeriesSource"]

log = logging.getLogger("sordino.guardian")

HOUR_S = 3600.0
_P99 = parse_threshold("0s", "p99_latency")
_QPS = parse_threshold("> 0", "qps")
# A p99 that rose while the load rose by more than this is the load's, not the change's.
LOAD_RISE = 1.2


class SeriesSource(Protocol):
    """What the guardian reads of the telemetry hub's series."""

    def recent(self, seconds: int | None = None) -> dict[ModelKey, list[SecondRow]]: ...

    def recent_resources(self, seconds: int | None = None) -> list[ResourceRow]: ...

    def statistics(self) -> SeriesStatistics: ...


ActionFactory = Callable[[ActionSpec, str | None], Action]


class Guardian:
    """Evaluates the triggers of ``config`` on ``series`` and runs their actions."""

    def __init__(
        self,
        config: SelfHealingConfig,
        *,
        series: SeriesSource,
        make_action: ActionFactory,
        events: EventSink,
        clock: Clock,
        wall: Callable[[], float] = time.time,
        alerts: AlertSender | None = None,
        timings: Callable[[str], Timings] | None = None,
    ) -> None:
        self.config = config
        self._series = series
        self._make_action = make_action
        self._events = events
        self._clock = clock
        self._wall = wall
        self.alerts = alerts
        self._timings = timings
        self._triggers = [
            TriggerState(t, t.parsed_threshold(), t.parsed_actions()) for t in config.triggers
        ]
        self._fired: deque[float] = deque()
        self._history: deque[float] = deque(maxlen=10_000)
        self._recorder = ActionRecorder(events, wall, alerts)
        self._task: asyncio.Task[None] | None = None
        self._work: set[asyncio.Task[None]] = set()
        self._started_s = int(wall())
        self._end_s = 0  # the last evaluation's end: a lower one is a clock set back
        self._budget_noted = False
        self._timing_rows: dict[str, Timings] = {}
        # Unique across restarts sharing a journal: the start time, then a counter.
        self._ids = (f"{self._wall():.3f}-{n}" for n in itertools.count(1))

    # -- lifecycle -------------------------------------------------------------------

    async def start(self) -> None:
        """Evaluate every ``interval`` from now on (in a task)."""
        self._started_s = int(self._wall())
        if self.alerts is not None:
            await self.alerts.start()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="sordino-guardian")

    async def stop(self) -> None:
        """Stop evaluating; changes still held stay (the server is stopping anyway)."""
        for task in [self._task, *self._work]:
            if task is not None:
                task.cancel()
        for task in [self._task, *self._work]:
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._task = None
        if self.alerts is not None:
            await self.alerts.stop()

    async def _run(self) -> None:
        while True:
            await self._clock.sleep(self.config.interval)
            try:
                self.evaluate()
            except Exception:  # the guardian must never take the server down
                log.exception("guardian evaluation failed")

    # -- one evaluation ----------------------------------------------------------------

    def evaluate(self) -> None:
        """Detect, verify, revert and fire once, for every trigger (never blocks)."""
        now = self._clock.now()
        last = self._series.statistics().last_closed
        end_s = (last + 1) if last is not None else int(self._wall())
        if end_s < self._end_s:
            self._clock_went_back(end_s)
        self._end_s = end_s
        # Enough seconds for the longest window (twice it for a change, plus verifying).
        keep = max(
            (2 * max(t.config.window_s, t.config.verify_s) for t in self._triggers), default=1
        )
        rows = self._series.recent(int(keep) + 2)
        if self.config.exclude_models:  # nodes with self_healing: false are not watched
            rows = {k: r for k, r in rows.items() if k.name not in self.config.exclude_models}
        resources = self._series.recent_resources(int(keep) + 2)
        self._timing_rows = {
            name: self._timings(name) if self._timings is not None else {}
            for name in ("network_latency", "frame_delay")
        }
        for trigger in self._triggers:
            self._evaluate(trigger, now, end_s, rows, resources)

    def _clock_went_back(self, end_s: int) -> None:
        """The wall clock was set back and the series goes on from the new time: the
        seconds the windows count from (the guardian's start, a trigger's last action,
        an action being verified) move back to it, or the windows stay empty until
        the clock comes back to those seconds."""
        self._started_s = min(self._started_s, end_s - 1)
        for trigger in self._triggers:
            if trigger.since_s is not None and trigger.since_s >= end_s:
                trigger.since_s = end_s - 1
            for running in trigger.verifying:
                running.applied_wall = min(running.applied_wall, end_s - 2.0)

    def _measure(
        self,
        trigger: TriggerState,
        rows: Mapping[ModelKey, Iterable[SecondRow]],
        resources: list[ResourceRow],
        end_s: int,
        since_s: int | None,
        window_s: float | None = None,
    ) -> Measure:
        return measure(
            trigger.threshold,
            rows,
            resources,
            model=trigger.config.model,
            end_s=end_s,
            window_s=window_s or trigger.config.window_s,
            since_s=max(self._started_s, since_s or 0),
            timings=self._timing_rows.get(trigger.config.metric),
        )

    def _evaluate(
        self,
        trigger: TriggerState,
        now: float,
        end_s: int,
        rows: Mapping[ModelKey, list[SecondRow]],
        resources: list[ResourceRow],
    ) -> None:
        current = self._measure(trigger, rows, resources, end_s, trigger.since_s)
        trigger.measure = current
        # What status shows: the latest value, even before a window after an action filled.
        trigger.shown = (
            current
            if current.value is not None or trigger.since_s is None
            else self._measure(trigger, rows, resources, end_s, None)
        )
        full = current.covered_s >= trigger.width
        value = current.value
        trigger.holds = full and value is not None and trigger.threshold.holds(value)
        if trigger.holds and trigger.holding_since is None:
            trigger.holding_since = self._wall()
        elif not trigger.holds:
            trigger.holding_since = None
        for running in [r for r in trigger.verifying if now >= r.verify_at]:
            self._conclude(trigger, running, now, end_s, rows, resources)
        if trigger.held:
            if value is None or self._clear(trigger.threshold, value, trigger.config.hysteresis):
                trigger.clear_since = trigger.clear_since or now
            else:
                trigger.clear_since = None
            if trigger.clear_since is not None and now - trigger.clear_since >= (
                trigger.config.cooldown_s
            ):
                held, trigger.held = trigger.held, []
                trigger.step = 0
                trigger.clear_since = None
                self._background(self._revert_all(trigger, held, "the condition stayed clear"))
        if trigger.holds:
            self._maybe_fire(trigger, now, end_s, rows)

    @staticmethod
    def _clear(threshold: Threshold, value: float, hysteresis: float) -> bool:
        """True when ``value`` is inside the threshold by the hysteresis margin."""
        if threshold.op in (">", ">="):
            return value < threshold.value * (1 - hysteresis)
        return value > threshold.value * (1 + hysteresis)

    # -- acting ----------------------------------------------------------------------

    def _maybe_fire(
        self,
        trigger: TriggerState,
        now: float,
        end_s: int,
        rows: Mapping[ModelKey, list[SecondRow]],
    ) -> None:
        if trigger.applying is not None or trigger.verifying:
            return
        if trigger.last_fired is not None and now - trigger.last_fired < trigger.config.cooldown_s:
            return
        while self._fired and now - self._fired[0] >= HOUR_S:
            self._fired.popleft()
        if len(self._fired) >= self.config.max_actions_per_hour:
            if not self._budget_noted:
                self._budget_noted = True
                self._events.emit(
                    "guardian_budget",
                    trigger.config.metric,
                    f"{len(self._fired)} actions in the last hour reach max_actions_per_hour "
                    f"({self.config.max_actions_per_hour}); further actions wait",
                )
            return
        self._budget_noted = False
        spec = trigger.specs[min(trigger.step, len(trigger.specs) - 1)]
        model = trigger.config.model
        action = self._make_action(spec, model)
        action.worst_model = trigger.measure.model if trigger.measure is not None else None
        busy = {
            r.action.conflict_key for t in self._triggers for r in t.running() if t is not trigger
        }
        if action.conflict_key in busy:
            return
        assert trigger.measure is not None
        running = RunningAction(
            action,
            started_wall=self._wall(),
            started=now,
            before=trigger.measure,
            p99_before=self._figure(rows, trigger.measure.model or model, end_s, trigger),
            qps_before=self._figure(rows, trigger.measure.model or model, end_s, trigger, of=_QPS),
            detected=trigger.holding_since,
            action_id=next(self._ids),
        )
        trigger.applying = running
        trigger.last_fired = now
        trigger.fired += 1
        self._fired.append(now)
        self._history.append(now)
        self._background(self._apply(trigger, running))

    def _figure(
        self,
        rows: Mapping[ModelKey, list[SecondRow]],
        model: str | None,
        end_s: int,
        trigger: TriggerState,
        since_s: int | None = None,
        *,
        of: Threshold = _P99,
    ) -> float | None:
        """The model's p99 latency (``of=_QPS``: its request rate) over the trigger's window."""
        return measure(
            of,
            rows,
            [],
            model=model,
            end_s=end_s,
            window_s=trigger.config.window_s,
            since_s=since_s,
        ).value

    async def _apply(self, trigger: TriggerState, running: RunningAction) -> None:
        reason = self._recorder.condition(trigger, running.before)
        try:
            applied = await running.action.apply(reason)
        except Exception as exc:
            log.exception("guardian action %s failed", running.action.spec)
            applied = Applied(f"tried {running.action.spec} but it failed: {exc}", {}, False)
        running.applied = applied
        running.applied_wall = self._wall()
        trigger.since_s = int(running.applied_wall) + 1
        trigger.applying = None
        running.verify_at = self._clock.now() + trigger.config.verify_s
        trigger.verifying.append(running)
        self._recorder.acted(trigger, running)

    def _conclude(
        self,
        trigger: TriggerState,
        running: RunningAction,
        now: float,
        end_s: int,
        rows: Mapping[ModelKey, list[SecondRow]],
        resources: list[ResourceRow],
    ) -> None:
        since = int(running.applied_wall) + 1
        after = self._measure(
            trigger, rows, resources, end_s, since, window_s=trigger.config.verify_s
        )
        needed = max(1, round(trigger.config.verify_s)) * (2 if trigger.threshold.change else 1)
        if after.covered_s < needed and now < running.verify_at + trigger.config.verify_s:
            return  # the series is a second behind: wait for the verify window to fill
        trigger.verifying.remove(running)
        holds_after = after.value is not None and not self._clear(
            trigger.threshold, after.value, trigger.config.hysteresis
        )
        if after.value is None and trigger.threshold.change is None:
            holds_after = False
        action = running.action
        verdict = action.verify(
            running.before.value, after.value, holds_after, trigger.threshold.op
        )
        if verdict == "worse" and trigger.config.metric == "qps":
            # Demand is not something an action makes worse: more requests after a
            # change is the traffic, and the p99 check below judges the change.
            verdict = "not cleared"
        target_model = running.before.model or trigger.config.model
        p99_after = self._figure(rows, target_model, end_s, trigger, since_s=since)
        qps_after = self._figure(rows, target_model, end_s, trigger, since_s=since, of=_QPS)
        load_rose = (
            running.qps_before is not None
            and qps_after is not None
            and qps_after > running.qps_before * LOAD_RISE
        )
        p99_worse = (
            action.reversible
            and not load_rose
            and running.p99_before is not None
            and p99_after is not None
            and p99_after > running.p99_before * 1.5
            and p99_after - running.p99_before > 0.02
        )
        if p99_worse:
            verdict = "worse"
        running.verdict = verdict
        assert running.applied is not None
        changed = running.applied.changed
        rolled_back = False
        if verdict != "cleared":
            trigger.step = min(trigger.step + 1, len(trigger.specs) - 1)
        if changed and action.reversible:
            if verdict == "worse" and self.config.recovery.rollback_on_failure:
                rolled_back = True
                self._background(self._revert_all(trigger, [running], None))
            else:
                trigger.held.append(running)
        extra = ""
        if p99_worse:
            extra = (
                f"; p99 latency went from {describe_value('p99_latency', running.p99_before)} "
                f"to {describe_value('p99_latency', p99_after)}"
            )
        self._recorder.verdict(trigger, running, after, rolled_back, extra)

    async def _revert_all(
        self, trigger: TriggerState, held: list[RunningAction], why: str | None
    ) -> None:
        for running in reversed(held):
            try:
                undone = await running.action.revert()
            except Exception:
                log.exception("guardian could not revert %s", running.action.spec)
                continue
            if why is not None and undone is not None:
                self._recorder.emit(
                    trigger,
                    running,
                    action=f"revert {running.action.spec}",
                    observed=list(trigger.measure.samples) if trigger.measure else [],
                    value=trigger.measure.value if trigger.measure else None,
                    verify="cleared",
                    rolled_back=False,
                    reverted=True,
                    explanation=(
                        f"{self._recorder.condition(trigger, trigger.measure)} for "
                        f"{span(trigger.config.cooldown_s)} (the cooldown); {undone}"
                    ),
                    phase=REVERTED,
                )

    def _background(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    # -- reading -----------------------------------------------------------------------

    def statistics(self) -> GuardianStatistics:
        now = self._clock.now()
        triggers = []
        for t in self._triggers:
            m = t.shown
            cooldown_left = (
                max(0.0, t.config.cooldown_s - (now - t.last_fired)) if t.last_fired else 0.0
            )
            triggers.append(
                TriggerStatistics(
                    name=t.config.name,
                    metric=t.config.metric,
                    model=t.config.model,
                    threshold=str(t.config.threshold),
                    window_s=t.config.window_s,
                    value=m.value if m else None,
                    value_text=describe_value(
                        t.config.metric, m.value if m else None, change=bool(t.threshold.change)
                    ),
                    holds=t.holds,
                    actions=tuple(str(s) for s in t.specs),
                    next_action=str(t.specs[min(t.step, len(t.specs) - 1)]),
                    cooldown_left_s=cooldown_left,
                    active=tuple(str(r.action.spec) for r in t.running()),
                    fired=t.fired,
                )
            )
        while self._fired and now - self._fired[0] >= HOUR_S:
            self._fired.popleft()
        sent, failed = self.alerts.counts() if self.alerts is not None else (0, 0)
        return GuardianStatistics(
            enabled=self.config.enabled,
            interval_s=self.config.interval,
            triggers=tuple(triggers),
            budget_per_hour=self.config.max_actions_per_hour,
            actions_last_hour=len(self._fired),
            records=self._recorder.count,
            alert_channels=self.config.alert_channels,
            alerts_sent=sent,
            alerts_failed=failed,
        )

    def fired_times(self) -> list[float]:
        """When actions were started (clock time), oldest first."""
        return list(self._history)
