"""From what a run measured to findings in words and suggested configuration.

Each finding is one sentence with the numbers behind it. Each suggestion is a
configuration key, the value to give it, and the observation that motivates it; only
keys this build's configuration schema has are suggested, so
:func:`apply_suggestions` always produces a file ``sordino.config.load_config``
accepts (it checks, and writes nothing otherwise).
"""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sordino.config.bounded import load_yaml
from sordino.config.loader import load_config
from sordino.errors import ConfigError
from sordino.loadtest.run import StressResult
from sordino.loadtest.server_metrics import ServerSample

__all__ = ["Suggestion", "apply_suggestions", "client_warnings", "findings", "suggestions"]

FRAGMENTATION_THRESHOLD = 0.70  # the brief's alarm level for fragmentation
# From here on the memory manager's defragmentation is suggested (docs/memory.md's example).
DEFRAG_THRESHOLD = 0.30
_RATE_SHORTFALL = 0.98
_LAG_LIMIT_MS = 50.0
_CPU_LIMIT = 90.0


@dataclass(frozen=True, slots=True)
class Suggestion:
    """Set ``key`` (dotted, as in ``sordino start --set``) to ``value`` because ``why``."""

    key: str
    value: Any
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "value": self.value, "why": self.why}


def _mmss(seconds: float) -> str:
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


def client_warnings(result: StressResult) -> list[str]:
    """Why the client, not the server, may have shaped the numbers (empty if it kept up)."""
    out = []
    intended, achieved = result.intended_mean, result.achieved_mean
    if intended and achieved < intended * _RATE_SHORTFALL:
        out.append(
            f"the client sent {achieved:.1f} requests/s against {intended:.1f} intended "
            f"({achieved / intended:.1%}): it could not keep the schedule"
        )
    if result.lag_p99_ms > _LAG_LIMIT_MS:
        out.append(
            f"requests left up to {result.lag_max_ms:.0f} ms late (p99 {result.lag_p99_ms:.0f} "
            "ms): the client's event loop was too busy to send on time"
        )
    if result.send.cap_waits:
        out.append(
            f"{result.send.cap_waits} requests waited for a free slot under the in-flight cap "
            f"({result.send.in_flight_cap}); raise --max-in-flight (their wait is in the latency)"
        )
    cpu = max(result.send.cpu_percent, default=0.0)
    if cpu > _CPU_LIMIT:
        out.append(
            f"the client process used {cpu:.0f}% of a CPU: run it on another machine or "
            "lower the rate"
        )
    return out


def _deltas(samples: list[ServerSample], attr: str) -> float | None:
    values = [getattr(s, attr) for s in samples if getattr(s, attr) is not None]
    return values[-1] - values[0] if len(values) >= 2 else None


def _peak(samples: list[ServerSample], attr: str) -> float | None:
    values = [getattr(s, attr) for s in samples if getattr(s, attr) is not None]
    return max(values) if values else None


def _knee(result: StressResult) -> tuple[int, float, float] | None:
    """Where p99 first stays above twice its typical value: (window, typical, then).

    Typical is the median over all windows (robust to the run's own bad stretch, and
    to a slow first window while connections open); three windows running must exceed
    it, so a stray slow second (a busy machine) is not a knee.
    """
    p99 = [w.p99_ms for w in result.windows]
    known = [p for p in p99 if p is not None]
    if len(known) < 4:
        return None
    base = float(np.median(known))

    def high(value: float | None) -> bool:
        return value is not None and value > 2 * base and value - base > 5.0

    for i in range(1, len(p99) - 2):
        if high(p99[i]) and high(p99[i + 1]) and high(p99[i + 2]):
            value = p99[i]
            assert value is not None
            return i, base, value
    return None


def findings(result: StressResult) -> list[str]:
    """What the run showed, in words, with the numbers."""
    out = []
    total, intended, achieved = result.total, result.intended_mean, result.achieved_mean
    answered = total.count + total.errors
    out.append(
        f"The client sent {result.send.sent} requests at {achieved:.1f}/s against "
        f"{intended:.1f}/s intended ({achieved / intended:.1%}); {answered} were answered."
        if intended
        else "The profile scheduled no requests."
    )
    if total.count:
        out.append(
            f"Latency from the intended send time: p50 {_ms(total.p50_ms)}, p99 "
            f"{_ms(total.p99_ms)}, p99.9 {_ms(total.p999_ms)}, max {_ms(total.max_ms)}."
        )
    knee = _knee(result)
    if knee is not None:
        i, before, after = knee
        rate = result.intended_rate[i] if i < len(result.intended_rate) else float("nan")
        out.append(
            f"p99 rose from {before:.1f} ms (typical) to {after:.1f} ms at "
            f"{_mmss(i * result.window_s)} into the run, when the intended rate was "
            f"{rate:.0f} requests/s."
        )
    ok_rates = [w.count / result.window_s for w in result.windows]
    if ok_rates:
        out.append(
            f"The server answered at most {max(ok_rates):.0f} requests/s successfully in any "
            f"{result.window_s:g} s window."
        )
    if result.errors:
        share = total.errors / answered if answered else 0.0
        by_status = ", ".join(f"{k}: {v}" for k, v in sorted(result.errors.items()))
        first = next((i for i, e in enumerate(result.window_errors) if e), 0)
        rate = result.intended_rate[first] if first < len(result.intended_rate) else 0.0
        out.append(
            f"{total.errors} requests failed ({share:.2%}; {by_status}), the first at "
            f"{_mmss(first * result.window_s)} when the intended rate was {rate:.0f}/s."
        )
    out += _client_error_findings(result)
    for verdict in result.slos:
        c = verdict.condition
        within = "" if verdict.attainment is None else f"; {verdict.attainment:.2%} within it"
        state = {True: "met", False: "missed", None: "not measured"}[verdict.met]
        out.append(
            f"SLO {c.text}: {c.metric} was {c.describe_value(verdict.measured)} against "
            f"{c.describe_value(c.value)}: {state}{within}."
        )
    out += _server_findings(result)
    looser = _looser_slo(result)
    if looser is not None:
        out.append(looser)
    return out


def _looser_slo(result: StressResult) -> str | None:
    """Say so when every p99 target tested is looser than the server's own (kept as it is)."""
    targets = [v.condition for v in result.slos if v.condition.metric == "p99"]
    current = _peak(result.server, "slo_target_s")
    if not targets or current is None:
        return None
    strictest = min(targets, key=lambda c: c.value)
    if strictest.value <= current * 1000 + 0.5:
        return None
    return (
        f"The strictest p99 target tested ({strictest.text}) is looser than the server's own "
        f"({current * 1000:.0f} ms, scheduler.slo_p99_ms); no change is suggested: the "
        "server's stricter target is kept."
    )


MOSTLY_CLIENT_ERRORS = 0.5
"""The share of answers above which a run measured refusals of its own requests."""


def mostly_client_errors(result: StressResult) -> str | None:
    """Why the run measured the server refusing its requests, when more than half of
    the answers were client errors (4xx but 429); else None. The command then exits 4."""
    answered = result.total.count + result.total.errors
    client = result.client_errors
    if not answered or client <= MOSTLY_CLIENT_ERRORS * answered:
        return None
    return (
        f"{client} of {answered} answers ({client / answered:.0%}) were client errors: the "
        "server refused the requests themselves, so this run measured refusals, not serving. "
        "Send inputs the model takes (--data FILE in perf_analyzer's format)"
    )


def _tally(by_status: dict[str, int]) -> tuple[int, str]:
    """How many in all, and ``"400 ×3, 404 ×1"``."""
    statuses = ", ".join(f"{k} ×{v}" for k, v in sorted(by_status.items()))
    return sum(by_status.values()), statuses


def _client_error_findings(result: StressResult) -> list[str]:
    """The client errors and refusals, apart, with what the server said."""
    out = []
    answered = result.total.count + result.total.errors
    client = result.errors_of("client_error")
    if client:
        n, statuses = _tally(client)
        out.append(
            f"{n} of {answered} answers were client errors ({n / answered:.1%}; {statuses}): "
            "the server refused the request itself, not the load."
        )
    refused = result.errors_of("refused")
    if refused:
        n, statuses = _tally(refused)
        out.append(
            f"{n} answers were refusals under load ({statuses}: shed, queue full, not ready "
            "or over a rate)."
        )
    if result.messages:
        shown = result.messages[:5]
        said = "; ".join(f"{status} ×{count}: {message!r}" for status, message, count in shown)
        more = len(result.messages) - len(shown)
        tail = f" (and {more} other messages)" if more > 0 else ""
        out.append(f"The server said: {said}{tail}.")
    if result.examples:
        out.append(f"Request bodies: {result.examples}.")
    return out


def _server_findings(result: StressResult) -> list[str]:
    samples = result.server
    if not result.server_observed:
        return ["The server's side was not observed (it exports no sordino /metrics)."]
    out = []
    depth = _peak(samples, "queue_depth")
    if depth is not None:
        out.append(f"Queue depth peaked at {depth:.0f} requests.")
    batches, rows = _deltas(samples, "batches"), _deltas(samples, "batch_rows")
    cap = _peak(samples, "max_batch")
    if batches and rows is not None:
        cap_text = f" (cap {cap:.0f})" if cap else ""
        out.append(
            f"Batches held {rows / batches:.1f} rows on average{cap_text} over "
            f"{batches:.0f} batches."
        )
    busy = _peak(samples, "busy")
    if busy is not None:
        out.append(f"The busiest model's instances were busy {busy:.0%} of a second at most.")
    frag = _peak(samples, "fragmentation")
    if frag is not None and frag >= 0.01:
        verb = "exceeded" if frag >= FRAGMENTATION_THRESHOLD else "rose to"
        out.append(
            f"Memory fragmentation {verb} {frag:.0%} under load "
            f"(threshold {FRAGMENTATION_THRESHOLD:.0%})."
        )
    in_use, reserved = _peak(samples, "pool_in_use_bytes"), _peak(samples, "pool_reserved_bytes")
    if in_use is not None and reserved:
        out.append(
            f"The shared-memory pool peaked at {in_use / 2**20:.1f} MiB in use of "
            f"{reserved / 2**20:.1f} MiB ({in_use / reserved:.0%})."
        )
    rss = _peak(samples, "rss_bytes")
    if rss is not None:
        out.append(f"The server's resident memory peaked at {rss / 2**20:.0f} MiB.")
    for attr, what in (
        ("worker_restarts", "worker restarts"),
        ("rejected", "requests refused by the server under load (shed, queue full; 429)"),
        ("client_rejected", "requests refused by the server as client errors (4xx)"),
        ("guardian_actions", "guardian actions"),
    ):
        delta = _deltas(samples, attr)
        if delta:
            out.append(f"{delta:.0f} {what} during the run.")
    if result.server_events:
        kinds: dict[str, int] = {}
        for event in result.server_events:
            kinds[event["kind"]] = kinds.get(event["kind"], 0) + 1
        listed = ", ".join(f"{k} ×{n}" for k, n in sorted(kinds.items()))
        out.append(f"The server journaled during the run: {listed} (listed in the report).")
    elif result.journal_note:
        out.append(f"Server events not read: {result.journal_note}.")
    return out


def _pow2(n: float) -> int:
    return int(2 ** math.ceil(math.log2(max(n, 1.0))))


def suggestions(result: StressResult) -> list[Suggestion]:
    """Configuration changes the measurements argue for, each with its reason."""
    out = []
    samples = result.server
    batches, rows = _deltas(samples, "batches"), _deltas(samples, "batch_rows")
    cap, depth = _peak(samples, "max_batch"), _peak(samples, "queue_depth")
    if batches and rows is not None and cap and depth is not None:
        mean = rows / batches
        if mean >= 0.8 * cap and depth > cap:
            out.append(
                Suggestion(
                    "scheduler.strategies.dynamic_batching.max_batch",
                    _pow2(cap * 2),
                    f"batches were nearly full ({mean:.1f} rows on average, cap {cap:.0f}) "
                    f"while up to {depth:.0f} requests waited",
                )
            )
    in_use, reserved = _peak(samples, "pool_in_use_bytes"), _peak(samples, "pool_reserved_bytes")
    if in_use is not None and reserved and in_use > 0.8 * reserved:
        size = _pow2(in_use * 2 / 2**20)
        out.append(
            Suggestion(
                "memory.pool_size",
                f"{size}MB",
                f"the shared-memory pool peaked at {in_use / reserved:.0%} of its "
                f"{reserved / 2**20:.0f} MiB",
            )
        )
    frag = _peak(samples, "fragmentation")
    if frag is not None and frag >= DEFRAG_THRESHOLD:
        seen = f"fragmentation reached {frag:.0%} under load"
        out += [
            Suggestion(
                "memory.strategy",
                "fragmentation_aware",
                f"{seen}: size tiers and lifetime classes keep small and short-lived "
                "blocks out of the region large batches need",
            ),
            Suggestion(
                "memory.defrag_interval",
                "3m",
                f"{seen}: compact the arena between batches every few minutes",
            ),
            Suggestion(
                "memory.defrag_threshold",
                DEFRAG_THRESHOLD,
                f"{seen}: also compact whenever it stays above {DEFRAG_THRESHOLD:.0%} for a minute",
            ),
        ]
    p99_targets = [v for v in result.slos if v.condition.metric == "p99"]
    current = _peak(samples, "slo_target_s")
    if p99_targets:
        strictest = min(p99_targets, key=lambda v: v.condition.value)
    # Only ever tighten: a tested target looser than the server's own must not loosen it
    # (the server's target drives its adaptive batching and shedding); findings say so.
    if p99_targets and (current is None or strictest.condition.value < current * 1000 - 0.5):
        out.append(
            Suggestion(
                "scheduler.slo_p99_ms",
                round(strictest.condition.value, 1),
                f"the server's own latency target (used by its adaptive batching and its "
                f"shedding) should be the strictest one tested: {strictest.condition.text}",
            )
        )
    if result.errors.get("503") and result.send.max_in_flight > 0:
        refused = result.errors["503"]
        out.append(
            Suggestion(
                "server.max_connections",
                max(64, _pow2(result.send.max_in_flight * 2)),
                f"{refused} requests were refused with 503 while up to "
                f"{result.send.max_in_flight} were in flight: a connection cap above that "
                "keeps refusals to the scheduler, which sheds by priority",
            )
        )
    return out


def _set(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    if parts[:2] == ["scheduler", "strategies"]:
        # Strategies are a list of sections told apart by name: merge into the right one.
        scheduler = data.setdefault("scheduler", {})
        strategies = scheduler.setdefault("strategies", [])
        name, field = parts[2], parts[3]
        entry = next((s for s in strategies if s.get("name") == name), None)
        if entry is None:
            entry = {"name": name}
            strategies.append(entry)
        entry[field] = value
        return
    node = data
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"cannot set {key}: {part} is not a section in the file")
        node = child
    node[parts[-1]] = value


def suggestions_yaml(items: list[Suggestion]) -> str:
    """The suggestions as one YAML snippet, each key preceded by its reason."""
    data: dict[str, Any] = {}
    for item in items:
        _set(data, item.key, item.value)
    reasons = "".join(f"# {item.key}: {item.why}\n" for item in items)
    return reasons + yaml.safe_dump(data, sort_keys=False)


def apply_suggestions(path: Path, items: list[Suggestion]) -> None:
    """Merge ``items`` into the config file at ``path`` (created if missing).

    The merged file is validated with :func:`load_config` before it replaces the old
    one; a result that would not load raises :class:`ConfigError` and changes nothing.
    """
    data: dict[str, Any] = {}
    if path.exists():
        loaded = load_yaml(path.read_text("utf-8"), str(path))[0]
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"{path} is not a configuration mapping; cannot merge into it")
        data = loaded or {}
    for item in items:
        _set(data, item.key, item.value)
    header = "".join(f"# stress-test suggested {item.key}: {item.why}\n" for item in items)
    text = header + yaml.safe_dump(data, sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".yaml")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        try:
            load_config(Path(name))
        except ConfigError as exc:
            raise ConfigError(
                f"merging the suggestions into {path} would not load: "
                + str(exc).replace(name, str(path))
            ) from None
        os.replace(name, path)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
