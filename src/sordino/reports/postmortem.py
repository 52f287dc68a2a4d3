"""``sordino postmortem``: what happened during a named event, from the journal alone.

:func:`postmortem` takes a :class:`JournalWindow` (read from a journal file, which
may be a copy taken after the server is gone) and builds a :class:`Postmortem`: the
target / actual / verdict table that opens the report, availability by priority
class (503s and timeouts apart), p99 against each model's target over time, every
guardian action with its outcome, the manual interventions (chaos, model control,
reconfiguration; never event marks, which only name the period), resource
utilisation (mean and peak per resource: :class:`ResourceUse`,
``postmortem_resources.py``), the incidents with their time to repair
(:class:`Incident`, ``postmortem_incidents.py``), the worst windows with their likely
causes (the diagnose anomaly engine) and recommendations. Guardian actions and
interventions are read in ``postmortem_actions.py``; the page is drawn in
``postmortem_render.py``.

Where its figures come from: the per-second ``series`` rows (requests, errors by
reason, p99, busy), the ``resources`` rows, and events — ``availability`` (accepted
requests by priority and outcome, every 10 s), ``guardian`` (payload ``trigger``,
``action``, ``started``, ``ended``, ``verify``, ``rolled_back``, ``explanation``;
``phase`` and ``action_id`` join an action's record to its later verdict),
``fault_injected``/``fault_cleared``, ``admin_call``, ``model_loaded`` (the SLO) and
``event_mark`` (``sordino event mark``).
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

from sordino.reports.diagnose import Diagnosis, describe, diagnose, when
from sordino.reports.postmortem_actions import (
    GuardianAction,
    Intervention,
    guardian_actions,
    interventions,
)
from sordino.reports.postmortem_incidents import Incident, incidents
from sordino.reports.postmortem_resources import ResourceUse, resource_use, utilisation
from sordino.telemetry.availability import outcome_class
from sordino.telemetry.journal import MARK_KIND as JOURNAL_MARK_KIND
from sordino.telemetry.journal_reader import JournalEvent, JournalWindow

__all__ = [
    "SECTIONS",
    "ClassAvailability",
    "Postmortem",
    "TargetRow",
    "Targets",
    "find_marks",
    "parse_moment",
    "postmortem",
]

SECTIONS = (
    "availability", "latency", "guardian", "interventions", "resources", "repair", "windows",
)  # fmt: skip
MARK_KIND = JOURNAL_MARK_KIND


@dataclass(frozen=True, slots=True)
class Targets:
    """What the period was meant to achieve."""

    availability: float = 0.999
    slo_attainment: float = 0.99
    repair_s: float = 10.0
    """Mean time to repair (the brief's "<10 s (self-healing)")."""


@dataclass(frozen=True, slots=True)
class TargetRow:
    what: str
    target: str
    actual: str
    verdict: str  # "met", "missed" or "n/a"


@dataclass(frozen=True, slots=True)
class ClassAvailability:
    """Requests of one priority class (or model) and how they ended.

    ``accepted`` requests were queued and ended ``ok``, ``unavailable`` (503),
    ``timeout`` or ``failed``; ``refused`` were turned away before acceptance (shed,
    queue full, not ready: 503; over a rate: 429) and ``client_errors`` refused as the
    client's mistake (4xx: bad input, unknown version). Availability is the share of
    the requests the server should have answered that it answered: ``ok`` of
    ``accepted + refused``; client errors are shown beside it, never counted in it.
    """

    name: str
    accepted: int
    ok: int
    unavailable: int
    timeout: int
    failed: int
    refused: int = 0
    client_errors: int = 0

    @property
    def received(self) -> int:
        return self.accepted + self.refused + self.client_errors

    @property
    def availability(self) -> float | None:
        counted = self.accepted + self.refused
        return self.ok / counted if counted else None


@dataclass(slots=True)
class Postmortem:
    """Everything the report shows, in its order."""

    name: str
    start: float
    end: float
    source: str
    sections: tuple[str, ...]
    targets: list[TargetRow]
    by_priority: list[ClassAvailability]
    by_model: list[ClassAvailability]
    slo_ms: dict[str, float]
    guardian: list[GuardianAction]
    interventions: list[Intervention]
    utilisation: list[str]
    worst: list[str]
    recommendations: list[str]
    diagnosis: Diagnosis
    notes: list[str] = field(default_factory=list)
    resource_use: list[ResourceUse] = field(default_factory=list)
    incidents: list[Incident] = field(default_factory=list)

    @property
    def window(self) -> JournalWindow:
        return self.diagnosis.window

    @property
    def active_models(self) -> list[str]:
        """The models that had traffic in the period."""
        return [m.name for m in self.diagnosis.models if m.requests]


_MOMENT_FORMATS = ("%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M")


def parse_moment(text: str) -> float:
    """``"2026-11-27 08:00"`` (local time, seconds optional) or epoch seconds, as epoch seconds.

    Raises ValueError saying what to write instead.
    """
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    for fmt in _MOMENT_FORMATS:
        try:
            return dt.datetime.strptime(text, fmt).timestamp()
        except ValueError:
            pass
    raise ValueError(f"{text!r} is not a time: write YYYY-MM-DD HH:MM[:SS] (local time)")


def find_marks(events: Iterable[JournalEvent], name: str) -> tuple[float | None, float | None]:
    """The last ``--start`` mark of ``name`` and the first ``--end`` mark after it."""
    marks = [e for e in events if e.kind == MARK_KIND and e.subject == name]
    starts = [e.t for e in marks if e.payload.get("edge") == "start"]
    start = max(starts) if starts else None
    ends = [
        e.t for e in marks if e.payload.get("edge") == "end" and (start is None or e.t >= start)
    ]
    return start, (min(ends) if ends else None)


def _pct(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:.{digits}%}"


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "missed")


def _priority_name(level: int) -> str:
    return f"priority {level}" + (" (highest)" if level == 1 else "")


_TALLIED = ("accepted", "ok", "unavailable", "timeout", "failed")


def _availability(
    window: JournalWindow, later: Iterable[JournalEvent]
) -> tuple[list[ClassAvailability], list[ClassAvailability]]:
    tallies: dict[int, dict[str, int]] = {}
    # A bucket is journaled when it closes, so the last ones of the period come after it:
    # they are placed by the start of their bucket, not by when they were written.
    for event in [*window.events, *later]:
        start = event.payload.get("start")
        if event.kind != "availability" or not isinstance(start, int | float):
            continue
        if not window.start - 10 < start < window.end:
            continue
        for row in event.payload.get("counts", []):
            tally = tallies.setdefault(int(row.get("priority", 0)), {})
            for key in (*_TALLIED, "client_error", "refused"):
                tally[key] = tally.get(key, 0) + int(row.get(key, 0))
    by_priority = [
        ClassAvailability(
            _priority_name(level) if level else "not yet prioritised (refused at admission)",
            t["accepted"],
            t["ok"],
            t["unavailable"],
            t["timeout"],
            t["failed"],
            refused=t["refused"],
            client_errors=t["client_error"],
        )
        for level, t in sorted(tallies.items())
    ]
    by_model = []
    for model in window.models:
        rows = window.rows_of(model)
        counts = {"ok": 0, "unavailable": 0, "timeout": 0, "failed": 0, "cancelled": 0}
        for row in rows:
            counts["ok"] += row.requests - row.errors
            for reason, n in row.errors_by_reason.items():
                counts[outcome_class("failure", reason)] += n
        accepted = sum(r.requests for r in rows)
        refused = sum(r.refused for r in rows)
        client_errors = sum(r.client_errors for r in rows)
        # Refused at admission by a server failure (a 500): accepted, and failed.
        other = sum(r.received for r in rows) - accepted - refused - client_errors
        by_model.append(
            ClassAvailability(
                model,
                accepted + other,
                counts["ok"],
                counts["unavailable"],
                counts["timeout"],
                counts["failed"] + other,
                refused=refused,
                client_errors=client_errors,
            )
        )
    return by_priority, by_model


def _repair_row(found: list[Incident], target_s: float) -> TargetRow:
    times = [i.time_to_repair for i in found if i.time_to_repair is not None]
    open_ = len(found) - len(times)
    still = f", {open_} not repaired in the period" if open_ else ""
    if not times:
        actual = f"none of {len(found)} repaired in the period"
        return TargetRow(
            "time to repair (mean / median / worst)", f"< {target_s:g} s", actual, "missed"
        )
    mean = statistics.fmean(times)
    return TargetRow(
        f"time to repair (mean / median / worst of {len(found)} incident(s))",
        f"< {target_s:g} s",
        f"{mean:.1f} / {statistics.median(times):.1f} / {max(times):.1f} s{still}",
        _verdict(mean < target_s and not open_),
    )


def _worst(diagnosis: Diagnosis, slo_ms: dict[str, float]) -> list[str]:
    out = []
    for anomaly in diagnosis.anomalies:
        cause = anomaly.likely_cause
        because = (
            f" Likely cause: {cause.event.kind} on {cause.event.subject} at "
            f"{when(cause.event.t)} ({cause.why})."
            if cause is not None
            else " No journaled event explains it."
        )
        out.append(f"{describe(anomaly)}.{because}")
    window = diagnosis.window
    for model in window.models:
        rows = [r for r in window.rows_of(model) if r.p99_ms is not None]
        if not rows:
            continue
        worst = max(rows, key=lambda r: r.p99_ms or 0.0)
        target = slo_ms.get(model)
        versus = f" (target {target:.0f} ms)" if target else ""
        out.append(
            f"{model}'s worst second was {when(worst.t)}: p99 {worst.p99_ms:.1f} ms{versus}, "
            f"{worst.requests} requests, queue depth {worst.queue_depth}."
        )
    return out


def _slos(window: JournalWindow, earlier: Iterable[JournalEvent]) -> dict[str, float]:
    slos = {}
    for event in [*earlier, *window.events]:
        if event.kind == "model_loaded" and "slo_p99_ms" in event.payload:
            slos[event.subject.split("/")[0]] = float(event.payload["slo_p99_ms"])
    return slos


def _recommendations(
    diagnosis: Diagnosis, guardian: list[GuardianAction], slo_ms: dict[str, float]
) -> list[str]:
    out = list(diagnosis.recommendations)
    triggers: dict[str, list[GuardianAction]] = {}
    for action in guardian:
        triggers.setdefault(action.trigger, []).append(action)
    for trigger, actions in triggers.items():
        rolled = sum(a.outcome == "rolled back" for a in actions)
        if rolled:
            out.append(
                f"The guardian trigger {trigger!r} fired {len(actions)} time(s) and {rolled} "
                "action(s) were rolled back: its threshold is too eager for this traffic; raise "
                "it or lengthen its window."
            )
        elif len(actions) > 3:
            out.append(
                f"The guardian trigger {trigger!r} fired {len(actions)} times: the condition "
                "it repairs recurs; fix its cause in the configuration rather than per incident."
            )
    window = diagnosis.window
    for model, target in slo_ms.items():
        p99 = [r.p99_ms for r in window.rows_of(model) if r.p99_ms is not None]
        if p99 and target:
            closest = max(p99) / target
            if closest < 0.5:
                out.append(
                    f"{model}'s p99 never passed {closest:.0%} of its {target:.0f} ms target "
                    "(the latency triggers never came close to firing): there is headroom to "
                    "batch more or to run fewer instances."
                )
            elif closest < 1.0:
                out.append(
                    f"{model}'s p99 reached {closest:.0%} of its {target:.0f} ms target at worst: "
                    "close to firing; keep the latency trigger where it is and add capacity "
                    "before a larger event."
                )
    frag = [r.fragmentation for r in window.resources if r.fragmentation is not None]
    if frag and max(frag) > 0:
        out.append(
            f"Fragmentation peaked at {max(frag):.0%} against the 70% defragmentation threshold "
            f"({0.70 - max(frag):+.0%} headroom)."
        )
    return out


def postmortem(
    window: JournalWindow,
    *,
    name: str,
    source: str,
    targets: Targets = Targets(),
    sections: tuple[str, ...] = SECTIONS,
    earlier_events: Iterable[JournalEvent] = (),
    later_events: Iterable[JournalEvent] = (),
) -> Postmortem:
    """Build the postmortem of ``window``.

    ``earlier_events`` are the model loads before it (their SLOs); ``later_events``
    the journal's events in the minute after it (the availability tallies of its last
    seconds are written there).
    """
    slo_ms = _slos(window, earlier_events)
    diagnosis = diagnose(window, source=source)
    by_priority, by_model = _availability(window, later_events)
    guardian = guardian_actions(window.events)
    counted = sum(c.accepted + c.refused for c in by_model)
    ok = sum(c.ok for c in by_model)
    availability = ok / counted if counted else None
    received = sum(c.received for c in by_model)
    client_errors = sum(c.client_errors for c in by_model)
    rows = [
        TargetRow(
            "availability (successful / received, 4xx client errors excluded)",
            f"≥ {targets.availability:.2%}",
            _pct(availability, 3) + (f" of {counted}" if counted else ""),
            _verdict(None if availability is None else availability >= targets.availability),
        )
    ]
    if client_errors:
        rows.append(
            TargetRow(
                "client errors (4xx: refused as the client's mistake)",
                "—",
                f"{client_errors} of {received} received ({client_errors / received:.1%})",
                "n/a",
            )
        )
    for model in diagnosis.models:
        target = slo_ms.get(model.name)
        if target is None or model.requests == 0:
            continue
        rows.append(
            TargetRow(
                f"{model.name} p99 (typical / worst second)",
                f"≤ {target:.0f} ms",
                f"{model.p99_ms or 0:.1f} / {model.p99_max_ms or 0:.1f} ms",
                _verdict(None if model.p99_ms is None else model.p99_ms <= target),
            )
        )
        rows.append(
            TargetRow(
                f"{model.name} answered within its SLO",
                f"≥ {targets.slo_attainment:.0%}",
                _pct(model.slo_attainment),
                _verdict(
                    None
                    if model.slo_attainment is None
                    else model.slo_attainment >= targets.slo_attainment
                ),
            )
        )
    if guardian:
        rolled = sum(a.outcome == "rolled back" for a in guardian)
        rows.append(
            TargetRow(
                "guardian actions that held (not rolled back)",
                "all",
                f"{len(guardian) - rolled} of {len(guardian)}",
                _verdict(rolled == 0),
            )
        )
    use = resource_use(window)
    busy = [u for u in use if u.resource.endswith(": instances busy")]
    if busy:
        seconds = sum(u.seconds for u in busy)
        rows.append(
            TargetRow(
                "resource utilisation (instances busy: mean / peak second)",
                "—",
                f"{sum(u.mean * u.seconds for u in busy) / seconds:.1f}% / "
                f"{max(u.peak for u in busy):.1f}%",
                "n/a",
            )
        )
    found = incidents(window)
    if found:
        rows.append(_repair_row(found, targets.repair_s))
    notes = []
    if not by_priority:
        notes.append(
            "This journal has no per-priority tally (availability events are journaled by "
            "servers from this version on); availability is shown by model only."
        )
    return Postmortem(
        name=name,
        start=window.start,
        end=window.end,
        source=source,
        sections=sections,
        targets=rows,
        by_priority=by_priority,
        by_model=by_model,
        slo_ms=slo_ms,
        guardian=guardian,
        interventions=interventions(window.events),
        utilisation=utilisation(window),
        worst=_worst(diagnosis, slo_ms),
        recommendations=_recommendations(diagnosis, guardian, slo_ms),
        diagnosis=diagnosis,
        notes=notes,
        resource_use=use,
        incidents=found,
    )
