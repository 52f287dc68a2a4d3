"""One stress run, start to end: plan, send, observe the server, and summarise.

:func:`prepare` reads the model's metadata and builds the payloads (failing early
with a clear message when the server or the model is not there); :func:`execute`
runs the sender and the ``/metrics`` poller side by side and returns a
:class:`StressResult`, which the findings, the report and ``--json`` read.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from sordino.errors import ConfigError
from sordino.loadtest.payloads import (
    GENERATOR_PLATFORM,
    InputSpec,
    Payload,
    build_payloads,
    build_stream_payloads,
    example_payloads,
    read_data_file,
)
from sordino.loadtest.profiles import Profile
from sordino.loadtest.results import Condition, LatencySummary, Recorder, status_class
from sordino.loadtest.schedule import Schedule, make_schedule
from sordino.loadtest.sender import ClassPlan, Progress, SendStatistics, run_open_loop
from sordino.loadtest.server_metrics import MetricsPoller, ServerSample, journal_events

__all__ = [
    "Plan",
    "StressResult",
    "Unreachable",
    "Verdict",
    "execute",
    "judge",
    "prepare",
    "window_for",
]


class Unreachable(Exception):
    """The server or the model could not be reached before the run; the message says how."""


@dataclass(frozen=True, slots=True)
class Plan:
    url: str
    profile: Profile
    schedule: Schedule
    classes: list[ClassPlan]
    window_s: float
    examples: str | None = None  # what the bodies are, when not random tensors


@dataclass(frozen=True, slots=True)
class Verdict:
    condition: Condition
    measured: float | None
    attainment: float | None  # share of the group's answers within the target (SLOs)
    met: bool | None

    def to_json(self) -> dict[str, Any]:
        return {
            **self.condition.to_json(),
            "measured": self.measured,
            "attainment": self.attainment,
            "met": self.met,
        }


@dataclass(slots=True)
class StressResult:
    """Everything measured in one run."""

    url: str
    profile: Profile
    window_s: float
    intended_rate: list[float]
    sent_rate: list[float]
    windows: list[LatencySummary]
    window_errors: list[dict[str, int]]
    total: LatencySummary
    groups: dict[str, dict[str, LatencySummary]]  # kind -> name -> summary
    errors: dict[str, int]
    lag_p99_ms: float
    lag_max_ms: float
    send: SendStatistics
    server: list[ServerSample]
    server_observed: bool
    slos: list[Verdict] = field(default_factory=list)
    failures: list[Verdict] = field(default_factory=list)
    server_events: list[dict[str, Any]] = field(default_factory=list)
    journal_note: str | None = None  # why the server's journal was not read
    messages: list[tuple[str, str, int]] = field(default_factory=list)
    """(status, the server's message, answers) of error answers, most frequent first."""
    examples: str | None = None  # what the bodies were, when not random tensors

    def errors_of(self, kind: str) -> dict[str, int]:
        """The errors by status whose :func:`status_class` is ``kind``."""
        return {k: v for k, v in self.errors.items() if status_class(k) == kind}

    @property
    def client_errors(self) -> int:
        """Answers that refused the request itself (4xx but 429)."""
        return sum(self.errors_of("client_error").values())

    @property
    def intended_mean(self) -> float:
        return self.send.scheduled / self.profile.duration if self.profile.duration else 0.0

    @property
    def achieved_mean(self) -> float:
        span = max(self.profile.duration, self.send.last_send_s)
        return self.send.sent / span if span else 0.0

    def to_json(self) -> dict[str, Any]:
        def summary(s: LatencySummary) -> dict[str, Any]:
            return {k: getattr(s, k) for k in LatencySummary.__slots__}

        return {
            "url": self.url,
            "profile": self.profile.model_dump(mode="json"),
            "started_at": self.send.started_at,
            "duration_s": self.profile.duration,
            "window_s": self.window_s,
            "rate": {
                "intended_mean": self.intended_mean,
                "achieved_mean": self.achieved_mean,
                "intended": self.intended_rate,
                "sent": self.sent_rate,
            },
            "client": {
                "scheduled": self.send.scheduled,
                "sent": self.send.sent,
                "answered": self.send.answered,
                "send_lag_p99_ms": self.lag_p99_ms,
                "send_lag_max_ms": self.lag_max_ms,
                "cap_waits": self.send.cap_waits,
                "in_flight_cap": self.send.in_flight_cap,
                "max_in_flight": self.send.max_in_flight,
                "cpu_percent_max": max(self.send.cpu_percent, default=None),
            },
            "latency": summary(self.total),
            "groups": {
                kind: {name: summary(s) for name, s in members.items()}
                for kind, members in self.groups.items()
            },
            "windows": [
                {"start_s": i * self.window_s, **summary(s), "errors_by_status": e}
                for i, (s, e) in enumerate(zip(self.windows, self.window_errors, strict=True))
            ],
            "errors": self.errors,
            "errors_by_class": {
                kind: self.errors_of(kind)
                for kind in ("client_error", "refused", "server_error", "transport")
            },
            "error_messages": [
                {"status": status, "message": message, "count": count}
                for status, message, count in self.messages
            ],
            "payloads": self.examples or "random tensors from the model's metadata",
            "server": {
                "observed": self.server_observed,
                "samples": [s.to_json() for s in self.server],
                "events": self.server_events,
                "journal_note": self.journal_note,
            },
            "slos": [v.to_json() for v in self.slos],
            "fail_on": [v.to_json() for v in self.failures],
        }


_STARTUP_KINDS = frozenset({"server_started", "model_loaded", "worker_started"})


def window_for(duration_s: float) -> float:
    """The width of the report's time windows: about 120 of them, at least a second."""
    return float(max(1.0, np.ceil(duration_s / 120)))


def _get(url: str, what: str, *, expect_json: bool = True) -> Any:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise Unreachable(f"{url} answered 404: {what}") from None
        text = exc.read()[:200].decode(errors="replace")
        raise Unreachable(f"{url} answered {exc.code}: {text}") from None
    except urllib.error.URLError as exc:
        raise Unreachable(f"cannot reach {url}: {exc.reason}") from None
    except OSError as exc:
        raise Unreachable(f"cannot reach {url}: {exc}") from None
    if not expect_json:
        return None
    try:
        return json.loads(body)
    except ValueError:
        raise Unreachable(f"{url} did not answer JSON: is it a KServe v2 server?") from None


def prepare(
    url: str,
    default_model: str | None,
    profile: Profile,
    *,
    data: Path | None = None,
    seed: int = 0,
) -> Plan:
    """Check the server and models, build the payloads, and draw the schedule."""
    url = url.rstrip("/")
    classes = []
    metadata: dict[str, list[InputSpec]] = {}
    examples: dict[str, list[Payload] | None] = {}
    decoupled: dict[str, bool] = {}
    used: list[str] = []
    _get(url + "/v2/health/ready", "the server is not ready", expect_json=False)
    for traffic in profile.mix:
        model = traffic.model or default_model
        if model is None:
            raise ConfigError(
                "give --model NAME (or a 'model' for every class of the profile's mix)"
            )
        if model not in metadata:
            doc = _get(
                f"{url}/v2/models/{model}",
                f"the server has no model {model!r} (see GET {url}/v2/models or "
                "`sordino models list`)",
            )
            metadata[model] = [InputSpec.from_metadata(i) for i in doc.get("inputs", [])]
            config = _config(url, model)
            examples[model] = (
                example_payloads(metadata[model])
                if config.get("platform") == GENERATOR_PLATFORM
                else None
            )
            # Its answers are streams, which …/infer refuses; a generator's one image is
            # answered by …/generate too (with its example prompts, above).
            policy = config.get("model_transaction_policy")
            decoupled[model] = (
                isinstance(policy, dict)
                and policy.get("decoupled") is True
                and examples[model] is None
            )
        inputs = metadata[model]
        entries = read_data_file(data, inputs) if data is not None else None
        chosen = examples[model]
        stream = traffic.stream or decoupled[model]
        if stream and not traffic.stream:
            # Its only endpoints are the streams (…/infer refuses it): stream what was asked.
            used.append(f"{model}: decoupled, so its requests are streams (generate_stream)")
        if stream:
            payloads = build_stream_payloads(inputs, traffic.inputs, data=entries, seed=seed)
        elif entries is None and chosen is not None:
            payloads = chosen  # the model's example inputs: random ones it would refuse
            used.append(f"{model}: its {len(chosen)} example prompts")
        else:
            payloads = build_payloads(inputs, traffic.batch, data=entries, seed=seed)
        classes.append(
            ClassPlan(traffic.label, model, traffic.tenant, traffic.tag, payloads, stream)
        )
    schedule = make_schedule(profile, seed=seed)
    described = "; ".join(dict.fromkeys(used)) or None
    return Plan(url, profile, schedule, classes, window_for(profile.duration), described)


def _config(url: str, model: str) -> dict[str, Any]:
    """The model's configuration (``GET …/config``), or {} when the server has none to show."""
    try:
        doc = _get(f"{url}/v2/models/{model}/config", "no model configuration")
    except Unreachable:
        return {}
    return doc if isinstance(doc, dict) else {}


def _attainment(recorder: Recorder, key: tuple[str, str] | None, limit_ms: float) -> float | None:
    group = recorder.total if key is None else recorder.groups.get(key)
    if group is None:
        return None
    total = group.histogram.get_total_count() + group.errors
    if total == 0:
        return None
    within = sum(
        item.count_at_value_iterated_to
        for item in group.histogram.get_recorded_iterator()
        if item.value_iterated_to <= limit_ms * 1000
    )
    return float(within / total)


def _key_of(recorder: Recorder, selector: str | None) -> tuple[str, str] | None:
    if selector is None:
        return None
    for kind in ("class", "tenant", "model"):
        if (kind, selector) in recorder.groups:
            return (kind, selector)
    return ("class", selector)  # measured nothing: the verdict says n/a


def judge(recorder: Recorder, conditions: Sequence[Condition]) -> list[Verdict]:
    out = []
    for condition in conditions:
        key = _key_of(recorder, condition.selector)
        summary = recorder.summary(key)
        attainment = (
            _attainment(recorder, key, condition.value)
            if condition.op == "<" and condition.metric != "errors"
            else None
        )
        out.append(
            Verdict(
                condition, summary.value(condition.metric), attainment, condition.holds(summary)
            )
        )
    return out


def execute(
    plan: Plan,
    *,
    max_in_flight: int = 256,
    timeout_s: float = 60.0,
    slos: Sequence[Condition] = (),
    fail_on: Sequence[Condition] = (),
    progress: Callable[[Progress], None] | None = None,
    poll_metrics: bool = True,
    token: str | None = None,
) -> StressResult:
    """Run ``plan`` (blocking) and return what it measured.

    Against a sordino server (its ``/metrics`` answered) the events its journal holds
    for the run are read afterwards, with the admin ``token`` when it has one.
    """
    windows = max(1, int(np.ceil(plan.profile.duration / plan.window_s)))
    recorder = Recorder(plan.window_s, windows)
    poller = MetricsPoller(plan.url)

    async def main() -> SendStatistics:
        stop = asyncio.Event()
        polling = asyncio.create_task(poller.run(stop)) if poll_metrics else None
        try:
            return await run_open_loop(
                plan.url,
                plan.schedule,
                plan.classes,
                recorder,
                max_in_flight=max_in_flight,
                timeout_s=timeout_s,
                progress=progress,
            )
        finally:
            stop.set()
            if polling is not None:
                await polling

    send = _run(main())
    events: list[dict[str, Any]] = []
    note = None
    if poller.is_sordino:
        end = send.started_at + max(send.elapsed_s, plan.profile.duration) + 1
        events, note = journal_events(plan.url, send.started_at - 1, end, token)
        # A server started for the run journals its own start just before: not news.
        events = [
            e
            for e in events
            if not (e.get("t", 0.0) < send.started_at and e.get("kind") in _STARTUP_KINDS)
        ]
    groups: dict[str, dict[str, LatencySummary]] = {}
    for kind, name in sorted(recorder.groups):
        groups.setdefault(kind, {})[name] = recorder.summary((kind, name))
    return StressResult(
        url=plan.url,
        profile=plan.profile,
        window_s=plan.window_s,
        intended_rate=plan.schedule.intended_rate(plan.window_s).tolist()[:windows],
        sent_rate=[n / plan.window_s for n in recorder.sent],
        windows=recorder.window_summaries(),
        window_errors=[dict(c) for c in recorder.window_errors],
        total=recorder.summary(),
        groups=groups,
        errors=dict(recorder.errors),
        lag_p99_ms=recorder.lag.get_value_at_percentile(99.0) / 1000,
        lag_max_ms=recorder.lag.get_max_value() / 1000,
        send=send,
        server=poller.samples,
        server_observed=bool(poller.is_sordino),
        slos=judge(recorder, slos),
        failures=judge(recorder, fail_on),
        server_events=events,
        journal_note=note,
        messages=[(k[0], k[1], n) for k, n in recorder.messages.most_common()],
        examples=plan.examples,
    )


def _run(coro: Any) -> SendStatistics:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        result: SendStatistics = asyncio.run(coro)
        return result
    out: SendStatistics = uvloop.run(coro)
    return out
