"""The server's side of a run: ``/metrics`` read once a second while the load runs.

Only a sordino server exports these series; against any other KServe v2 server the
poller finds none and the report says the server side was not observed. Series that
this server does not export (an older build, no memory pool, no guardian yet) are
simply absent from the samples: every field is optional.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sordino.telemetry.availability import rejection_class
from sordino.telemetry.journal import MARK_KIND

__all__ = ["MetricsPoller", "ServerSample", "journal_events", "journal_file"]

# Bookkeeping, not happenings (the run's own event marks among them).
_QUIET_KINDS = ("availability", "operator_profile", MARK_KIND)


@dataclass(frozen=True, slots=True)
class ServerSample:
    """What the server exported at wall time ``t`` (sums over models and pools)."""

    t: float
    queue_depth: float | None = None
    inflight: float | None = None
    batches: float | None = None  # counter: executed batches
    batch_rows: float | None = None  # counter: rows in them (histogram sum)
    max_batch: float | None = None  # the largest cap any model's scheduler uses now
    busy: float | None = None  # the busiest model's busy fraction
    rss_bytes: float | None = None
    pool_reserved_bytes: float | None = None
    pool_in_use_bytes: float | None = None
    fragmentation: float | None = None  # the worst pool
    worker_restarts: float | None = None  # counter
    rejected: float | None = None  # counter: refused under load (503 shed, queue full; 429)
    client_rejected: float | None = None  # counter: refused as client errors (4xx but 429)
    guardian_actions: float | None = None  # counter: any sordino_guardian_* *_total series
    slo_target_s: float | None = None  # the strictest model's p99 target (slo_p99_ms)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _add(values: dict[str, float], key: str, value: float, how: str = "sum") -> None:
    if key not in values:
        values[key] = value
    elif how == "max":
        values[key] = max(values[key], value)
    else:
        values[key] += value


def parse_metrics(text: str, t: float) -> ServerSample | None:
    """One sample from a Prometheus text page; None when it holds no sordino series."""
    values: dict[str, float] = {}
    seen = False
    for family in text_string_to_metric_families(text):
        if family.name.startswith("sordino_"):
            seen = True
        for s in family.samples:
            name, v = s.name, float(s.value)
            if name == "sordino_queue_depth":
                _add(values, "queue_depth", v)
            elif name == "sordino_inflight_requests":
                _add(values, "inflight", v)
            elif name == "sordino_batch_size_count":
                _add(values, "batches", v)
            elif name == "sordino_batch_size_sum":
                _add(values, "batch_rows", v)
            elif name == "sordino_scheduler_max_batch":
                _add(values, "max_batch", v, "max")
            elif name == "sordino_worker_busy_ratio":
                _add(values, "busy", v, "max")
            elif name == "sordino_process_resident_memory_bytes":
                _add(values, "rss_bytes", v)
            elif name == "sordino_memory_pool_reserved_bytes":
                _add(values, "pool_reserved_bytes", v)
            elif name == "sordino_memory_pool_in_use_bytes":
                _add(values, "pool_in_use_bytes", v)
            elif name == "sordino_memory_pool_fragmentation_ratio":
                _add(values, "fragmentation", v, "max")
            elif name == "sordino_worker_restarts_total":
                _add(values, "worker_restarts", v)
            elif name == "sordino_rejected_requests_total":
                kind = rejection_class(s.labels.get("reason", ""))
                _add(values, "client_rejected" if kind == "client_error" else "rejected", v)
            elif name == "sordino_slo_target_seconds":
                values["slo_target_s"] = min(values.get("slo_target_s", v), v)
            elif name.startswith("sordino_guardian_") and name.endswith("_total"):
                _add(values, "guardian_actions", v)
    return ServerSample(t=t, **values) if seen else None


class MetricsPoller:
    """Reads ``url/metrics`` every ``interval_s`` until stopped."""

    def __init__(self, url: str, interval_s: float = 1.0) -> None:
        self.url = url.rstrip("/")
        self.interval_s = interval_s
        self.samples: list[ServerSample] = []
        self.failures = 0
        self.is_sordino: bool | None = None

    async def run(self, stop: asyncio.Event) -> None:
        timeout = aiohttp.ClientTimeout(total=max(2.0, self.interval_s))
        async with aiohttp.ClientSession(timeout=timeout) as client:
            while not stop.is_set():
                await self.poll(client)
                if self.is_sordino is False:
                    return  # not a sordino server: nothing to read
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval_s)
            await self.poll(client)  # the final counters

    async def poll(self, client: aiohttp.ClientSession) -> None:
        try:
            async with client.get(self.url + "/metrics") as response:
                status, text = response.status, await response.text()
        except (aiohttp.ClientError, OSError, TimeoutError, UnicodeDecodeError):
            self.failures += 1
            return
        if status != 200:
            self.is_sordino = self.is_sordino or False
            return
        try:
            sample = parse_metrics(text, time.time())
        except ValueError:
            sample = None
        if sample is None:
            self.is_sordino = self.is_sordino or False
            return
        self.is_sordino = True
        self.samples.append(sample)


def _get_json(url: str, path: str, token: str | None) -> Any:
    """``GET url+path`` with the admin token if given, its body parsed as JSON.

    Raises what urllib and json raise (``HTTPError`` for an answer that is not 2xx).
    """
    request = urllib.request.Request(f"{url.rstrip('/')}{path}")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def journal_events(
    url: str, start: float, end: float, token: str | None = None
) -> tuple[list[dict[str, Any]], str | None]:
    """The events a sordino server journaled in ``[start, end)``, and why not if none.

    Reads ``GET /v2/sordino/journal`` (a protected endpoint: a loopback server without
    an admin token answers anyone; otherwise ``token`` is needed). Returns the events
    (``t``, ``kind``, ``subject``, ``cause``, ``payload``), oldest first, and None; or
    an empty list and a sentence saying why they could not be read.
    """
    query = urllib.parse.urlencode({"start": start, "end": end})
    try:
        document = _get_json(url, f"/v2/sordino/journal?{query}", token)
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            return [], f"the server's journal needs its admin token (--token): {exc.code}"
        return [], f"the server's journal could not be read: HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return [], f"the server's journal could not be read: {exc}"
    events = [e for e in document.get("events", []) if e.get("kind") not in _QUIET_KINDS]
    return events, None


def journal_file(url: str, token: str | None = None) -> tuple[str | None, str | None]:
    """The path of the journal a sordino server writes, and why not if it is not known.

    Reads ``GET /v2/sordino/telemetry``: its full view (the admin token, or a loopback
    server without one) names the journal file; the public view and other servers do
    not. Returns the path and None, or None and a sentence saying why.
    """
    try:
        document = _get_json(url, "/v2/sordino/telemetry", token)
    except urllib.error.HTTPError as exc:
        return None, f"the server is not sordino, or did not answer: HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return None, f"the server's telemetry could not be read: {exc}"
    journal = document.get("journal") if isinstance(document, dict) else None
    if not isinstance(journal, dict):
        return None, "the server keeps no journal"
    path = journal.get("path")
    if not isinstance(path, str):
        return None, "the server names its journal only to its admin (give --token)"
    return path, None
