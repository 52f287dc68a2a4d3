"""``sordino postmortem``: what happened during a named event, from the journal alone.

:func:`postmortem` takes a :class:`JournalWindow` (read from a journal file, which
may be a copy taken after the server is gone) and builds a :class:`Postmortem`: the
target / actual / verdict table that opens the report, availability by priority
class (503s and timeouts apart), p99 against each model's target over time, every
guardian action with its outcome, the manual interventions (chaos, model control,
reconfiguration; never event marks, which only name the period), resource
utilisation (mean and peak per resource: :class:`ResourceUse`), the incidents with
their time to repair (:class:`Incident`, :func:`incidents`), the worst windows with
their likely causes (the diagnose anomaly engine) and recommendations.

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
from typing import Any

import numpy as np

from sordino.reports.diagnose import Diagnosis, describe, diagnose, when
from sordino.telemetry.availability import outcome_class, rejection_class
from sordino.telemetry.journal import MARK_KIND as JOURNAL_MARK_KIND
from sordino.telemetry.journal_reader import JournalEvent, JournalWindow
from sordino.telemetry.series import SecondRow

__all__ = [
    "FAULT_KINDS",
    "QUIET_S",
    "SECTIONS",
    "ClassAvailability",
    "GuardianAction",
    "Incident",
    "Intervention",
    "Postmortem",
    "ResourceUse",
    "TargetRow",
    "Targets",
    "find_marks",
    "incidents",
    "parse_moment",
    "postmortem",
    "resource_use",
]

SECTIONS = (
    "availability", "latency", "guardian", "interventions", "resources", "repair", "windows",
)  # fmt: skip
QUIET_S = 5
"""An incident is repaired once clients have seen no error for this many seconds."""
FAULT_KINDS = (
    "fault_injected", "worker_failed", "device_unavailable", "instance_ejected", "guardian",
)  # fmt: skip
"""Events that open an incident (or explain one) even before any client saw an error."""
MARK_KIND = JOURNAL_MARK_KIND
# Event marks name the period (a person, or `sordino stress-test`, wrote them) but change
# nothing in the server: they are not interventions.
_INTERVENTION_KINDS = ("fault_injected", "fault_cleared", "admin_call")


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


@dataclass(frozen=True, slots=True)
class GuardianAction:
    t: float
    trigger: str
    action: str
    started: float | None
    ended: float | None
    verify: str
    outcome: str  # "succeeded", "rolled back" or "unknown"
    explanation: str


@dataclass(frozen=True, slots=True)
class Intervention:
    t: float
    kind: str
    subject: str
    detail: str


@dataclass(frozen=True, slots=True)
class ResourceUse:
    """One resource over the period: its mean and its peak second, in ``unit``.

    Means are over the seconds the journal holds a figure for (``seconds``); shares
    (``unit == "%"``) are percentages.
    """

    resource: str
    unit: str
    mean: float
    peak: float
    peak_at: int
    seconds: int


@dataclass(frozen=True, slots=True)
class Incident:
    """A stretch when clients saw errors, or a fault was journaled, and its repair.

    ``start`` is the earlier of the first second with errors and the first fault event
    (:data:`FAULT_KINDS`); ``repaired`` the first moment after which clients saw no
    error for :data:`QUIET_S` seconds (the end of the last second with errors, or the
    last fault event when later), ``None`` when the period ended before that was seen.
    ``failed`` counts the requests that failed: errors of accepted requests (503,
    timeout, failure) and refusals at admission (503, 429, 500); 4xx client errors
    are the client's mistake and never count.
    """

    start: float
    repaired: float | None
    cause: str
    failed: int
    seconds_with_errors: int

    @property
    def time_to_repair(self) -> float | None:
        return None if self.repaired is None else self.repaired - self.start


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


def _guardian(events: Iterable[JournalEvent]) -> list[GuardianAction]:
    """One entry per action: a verdict record completes the record its action wrote
    when it acted (same ``action_id``); one whose action record is not in the window (or
    a journal from before records were split) counts as the action itself."""
    out: list[GuardianAction] = []
    acted: dict[str, int] = {}
    for e in events:
        if e.kind != "guardian":
            continue
        p = e.payload
        rolled = p.get("rolled_back")
        if p.get("verify") == "pending":
            outcome = "pending"
        else:
            outcome = "rolled back" if rolled else ("succeeded" if rolled is False else "unknown")
        action_id = p.get("action_id")
        first = acted.get(str(action_id)) if p.get("phase") == "verdict" else None
        entry = GuardianAction(
            t=e.t if first is None else out[first].t,
            trigger=str(p.get("trigger", e.cause or "?")),
            action=str(p.get("action", e.subject)),
            started=_number(p.get("started")),
            ended=_number(p.get("ended")),
            verify=str(p.get("verify", "")),
            outcome=outcome,
            explanation=str(p.get("explanation", "")),
        )
        if first is not None:
            out[first] = entry
            continue
        if p.get("phase") == "acted" and action_id is not None:
            acted[str(action_id)] = len(out)
        out.append(entry)
    return out


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _interventions(events: Iterable[JournalEvent]) -> list[Intervention]:
    out = []
    for e in events:
        if e.kind not in _INTERVENTION_KINDS and not e.kind.startswith("reconfig"):
            continue
        p = e.payload
        if e.kind == "fault_injected":
            extra = f" +{p['latency_s'] * 1000:.0f} ms" if p.get("latency_s") else ""
            duration = f" for {p['duration_s']:g} s" if p.get("duration_s") else ""
            detail = f"{p.get('fault')} fault{extra} at rate {p.get('rate')}{duration} ({e.cause})"
        elif e.kind == "fault_cleared":
            detail = f"{p.get('fault')} fault {p.get('id')} cleared ({e.cause})"
        elif e.kind == "admin_call":
            detail = f"{p.get('action')} ({e.cause}): {p.get('outcome')}"
        else:
            detail = e.cause or ", ".join(f"{k}={v}" for k, v in p.items())
        out.append(Intervention(e.t, e.kind, e.subject, detail))
    return out


def _utilisation(window: JournalWindow) -> list[str]:
    """What the table of :func:`resource_use` does not say."""
    out = []
    pool = [r.pool_in_use_bytes for r in window.resources if r.pool_in_use_bytes is not None]
    reserved = [r.pool_reserved_bytes for r in window.resources if r.pool_reserved_bytes]
    if pool and reserved:
        out.append(
            f"Shared-memory pool: up to {max(pool) / 2**20:.1f} MiB in use of "
            f"{max(reserved) / 2**20:.0f} MiB."
        )
    if window.resources:
        out.append(
            "Server CPU is the server process's, in percent of one core; the worker "
            "processes' CPU is not journaled: their instances' busy share stands for it."
        )
    return out or ["The journal holds no utilisation rows for this period."]


def _use(resource: str, unit: str, points: list[tuple[int, float]]) -> ResourceUse | None:
    if not points:
        return None
    peak_at, peak = max(points, key=lambda p: p[1])
    mean = float(np.mean([v for _, v in points]))
    return ResourceUse(resource, unit, mean, peak, peak_at, len(points))


def resource_use(window: JournalWindow) -> list[ResourceUse]:
    """Mean and peak of each resource the journal records each second.

    Server CPU is the server process's (percent of one core: more than 100 on several);
    the worker processes' CPU is not journaled, their instances' busy share (the share
    of their time spent computing, per model) stands for it. The arena's use is its
    bytes in use as a share of those reserved. GPU memory appears where a GPU was seen.
    """
    res = window.resources
    found = [
        _use("server CPU (% of one core)", "%", [(r.t, r.cpu_percent) for r in res]),
        _use("server resident memory", "MiB", [(r.t, r.rss_bytes / 2**20) for r in res]),
        _use(
            "arena in use (share of reserved)",
            "%",
            [
                (r.t, 100 * r.pool_in_use_bytes / r.pool_reserved_bytes)
                for r in res
                if r.pool_in_use_bytes is not None and r.pool_reserved_bytes
            ],
        ),
        _use(
            "arena fragmentation",
            "%",
            [(r.t, 100 * r.fragmentation) for r in res if r.fragmentation is not None],
        ),
        _use(
            "GPU memory used",
            "MiB",
            [
                (r.t, r.gpu_memory_used_bytes / 2**20)
                for r in res
                if r.gpu_memory_used_bytes is not None
            ],
        ),
    ]
    for model in window.models:
        rows = window.rows_of(model)
        if not any(r.requests for r in rows):
            continue
        per_second: dict[int, list[float]] = {}
        for r in rows:  # versions of one model in one second: their mean
            per_second.setdefault(r.t, []).append(r.busy)
        found.append(
            _use(
                f"{model}: instances busy",
                "%",
                [(t, 100 * float(np.mean(b))) for t, b in sorted(per_second.items())],
            )
        )
    return [u for u in found if u is not None]


def _failed(row: SecondRow) -> int:
    """Requests of ``row`` a client saw fail: errors, refusals and 500s at admission."""
    refused = sum(
        n
        for reason, n in row.rejected_by_reason.items()
        if rejection_class(reason) != "client_error"
    )
    return row.errors + refused


def _fault_cause(event: JournalEvent) -> str | None:
    """What a fault event says happened; ``None`` for events that are no fault."""
    if event.kind not in FAULT_KINDS:
        return None
    p = event.payload
    if event.kind == "guardian":
        if p.get("phase") == "verdict":
            return None  # the verdict of an action already counted when it acted
        return f"guardian {p.get('action', event.subject)} ({p.get('trigger', event.cause)})"
    if event.kind == "fault_injected":
        return f"chaos {p.get('fault', '?')} fault on {event.subject}"
    because = f": {event.cause}" if event.cause else ""
    return f"{event.kind} on {event.subject}{because}"


def incidents(window: JournalWindow, quiet_s: int = QUIET_S) -> list[Incident]:
    """The period's incidents, in order (see :class:`Incident`).

    A second with failed requests, or a fault event, joins the incident in progress
    when it comes before clients had seen ``quiet_s`` seconds without errors since that
    incident's last one; otherwise it opens a new incident. A second without a series
    row saw no failure. A repair is confirmed only when the ``quiet_s`` clean seconds
    after it lie in the period.
    """
    failed: dict[int, int] = {}
    for row in window.series:
        n = _failed(row)
        if n:
            failed[row.t] = failed.get(row.t, 0) + n
    # (time, failed requests, cause): a second with errors, or a fault event.
    items: list[tuple[float, int, str | None]] = [(t, n, None) for t, n in failed.items()]
    for event in window.events:
        cause = _fault_cause(event)
        if cause is not None:
            items.append((event.t, 0, cause))
    items.sort(key=lambda item: item[0])
    groups: list[list[tuple[float, int, str | None]]] = []
    repaired = 0.0
    for item in items:
        t, n, _ = item
        if not groups or t >= repaired + quiet_s:
            groups.append([])
        groups[-1].append(item)
        # Clients see no error from the end of a failing second, or from a fault's moment.
        end = t + 1 if n else t
        repaired = end if len(groups[-1]) == 1 else max(repaired, end)
    out = []
    for group in groups:
        causes = [c for _, _, c in group if c is not None]
        ends = [t + 1 if n else t for t, n, _ in group]
        fixed = max(ends)
        out.append(
            Incident(
                start=group[0][0],
                repaired=fixed if fixed + quiet_s <= window.end else None,
                cause="; ".join(dict.fromkeys(causes)) or "no journaled fault explains it",
                failed=sum(n for _, n, _ in group),
                seconds_with_errors=sum(1 for _, n, _ in group if n),
            )
        )
    return out


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
    guardian = _guardian(window.events)
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
        interventions=_interventions(window.events),
        utilisation=_utilisation(window),
        worst=_worst(diagnosis, slo_ms),
        recommendations=_recommendations(diagnosis, guardian, slo_ms),
        diagnosis=diagnosis,
        notes=notes,
        resource_use=use,
        incidents=found,
    )
