"""The open-loop sender: requests leave on the schedule, whatever the server does.

A request never waits for an earlier one's answer (that would be a closed loop, which
slows down with the server and so hides its stalls — the coordinated omission wrk2
fixed). Each request's latency runs from its *intended* send time. The sender keeps
an in-flight cap (a pool of connections); a request that finds the cap full waits
for a slot, and that wait counts in its latency and in :attr:`SendStatistics.cap_waits`
so the report can say the client, not the server, was the bottleneck.

:func:`run_closed_loop` is the other kind, kept for comparison: ``concurrency``
clients, each sending its next request when the last one returns.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import aiohttp
import psutil

from sordino.loadtest.payloads import Payload
from sordino.loadtest.results import Recorder
from sordino.loadtest.schedule import Schedule

__all__ = ["ClassPlan", "Progress", "SendStatistics", "run_closed_loop", "run_open_loop"]


@dataclass(frozen=True, slots=True)
class ClassPlan:
    """A traffic class ready to send: where, with which headers and bodies."""

    label: str
    model: str
    tenant: str | None
    tag: str | None
    payloads: Sequence[Payload]
    stream: bool = False

    @property
    def path(self) -> str:
        if self.stream:
            return f"/v2/models/{self.model}/generate_stream"
        return f"/v2/models/{self.model}/infer"

    def headers(self, payload: Payload) -> dict[str, str]:
        headers = payload.headers
        if self.tenant:
            headers["X-Sordino-Tenant"] = self.tenant
        if self.tag:
            headers["X-Sordino-Tag"] = self.tag
        return headers

    def keys(self) -> list[tuple[str, str]]:
        return [("model", self.model), ("class", self.label), ("tenant", self.tenant or "-")]


@dataclass(frozen=True, slots=True)
class Progress:
    """A live view of the run for the progress display."""

    elapsed_s: float
    duration_s: float
    scheduled: int
    sent: int
    answered: int
    errors: int
    in_flight: int


@dataclass(slots=True)
class SendStatistics:
    """How the client itself did: was it able to send on time?"""

    started_at: float = 0.0  # wall clock of offset 0
    elapsed_s: float = 0.0
    last_send_s: float = 0.0  # offset of the last request's actual departure
    scheduled: int = 0
    sent: int = 0
    answered: int = 0
    cap_waits: int = 0
    max_in_flight: int = 0
    in_flight_cap: int = 0
    cpu_percent: list[float] = field(default_factory=list)  # client process, once a second


_FAILURES = (
    aiohttp.ClientError,
    aiohttp.http_exceptions.HttpProcessingError,
    OSError,
    TimeoutError,
)


def _failure(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    return f"client:{type(exc).__name__}"


def _session(limit: int, timeout_s: float) -> aiohttp.ClientSession:
    """A pool of at most ``limit`` keep-alive connections; answers slower than ``timeout_s`` fail.

    aiohttp rather than httpx: measured here, httpx spent about 3.8 ms of CPU per request
    at 64 in flight and aiohttp 0.1 ms, and an open-loop client must stay ahead of its
    schedule.
    """
    connector = aiohttp.TCPConnector(limit=limit, limit_per_host=limit)
    return aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=timeout_s)
    )


def _message(body: bytes) -> str:
    """The server's message in an error answer: KServe v2's ``{"error": ...}``, else the text."""
    try:
        document = json.loads(body)
    except ValueError:
        document = None
    error = document.get("error") if isinstance(document, dict) else None
    if isinstance(error, str):
        return error
    return body[:300].decode("utf-8", "replace").strip() or "(no message)"


async def _post(
    session: aiohttp.ClientSession,
    url: str,
    plan: ClassPlan,
    payload: Payload,
    first: Callable[[], None] | None = None,
) -> tuple[str, str | None]:
    """Send one request; its status ("ok", the HTTP status, "timeout" or the client
    error) and, with an HTTP error, the server's message.

    A streaming request reads its Server-Sent Events to the end, calling ``first`` at
    the first one; an event carrying ``error`` (the server failed mid-stream) is the
    status ``stream-error``.
    """
    try:
        async with session.post(url, data=payload.body, headers=plan.headers(payload)) as answer:
            if answer.status != 200 or not plan.stream:
                body = await answer.read()
                if answer.status == 200:
                    return "ok", None
                return str(answer.status), _message(body)
            events = _Events()
            async for chunk in answer.content.iter_any():
                if events.feed(chunk) and first is not None:
                    first()
                    first = None
            events.feed(b"\n")  # a last line without its newline
            if events.failed:
                return "stream-error", None
            return ("ok" if events.count else "stream-empty"), None
    except _FAILURES as exc:
        return _failure(exc), None


class _Events:
    """Counts a Server-Sent Events stream's ``data:`` lines as its bytes come, keeping
    only the head of the line being read: an event may be megabytes (an image), more
    than any line a reader would hold (aiohttp's ``readline`` stops at 512 KiB)."""

    __slots__ = ("_head", "count", "failed")

    def __init__(self) -> None:
        self._head = b""
        self.count = 0
        self.failed = False

    def feed(self, chunk: bytes) -> bool:
        """Read ``chunk``; whether an event ended in it."""
        ended = False
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            room = _HEAD - len(self._head)
            if room > 0:
                self._head += chunk[start : min(len(chunk) if end == -1 else end, start + room)]
            if end == -1:
                return ended
            if self._head.startswith(b"data: "):
                self.count += 1
                self.failed = self.failed or self._head.startswith(b'data: {"error"')
                ended = True
            self._head = b""
            start = end + 1


_HEAD = 16
"""Bytes of a line enough to tell an event (``data: ``) and an error event apart."""


def _arrivals(schedule: Schedule, chunk: int = 8192) -> Iterator[tuple[float, int]]:
    """(offset, class) of every arrival, converted to Python numbers a chunk at a time."""
    for first in range(0, len(schedule), chunk):
        times = schedule.times[first : first + chunk].tolist()
        classes = schedule.classes[first : first + chunk].tolist()
        yield from zip(times, classes, strict=True)


async def _sample_cpu(stats: SendStatistics, stop: asyncio.Event) -> None:
    process = psutil.Process()
    process.cpu_percent(None)
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            stats.cpu_percent.append(process.cpu_percent(None))


async def run_open_loop(
    url: str,
    schedule: Schedule,
    classes: Sequence[ClassPlan],
    recorder: Recorder,
    *,
    max_in_flight: int = 256,
    timeout_s: float = 60.0,
    progress: Callable[[Progress], None] | None = None,
) -> SendStatistics:
    """Send ``schedule`` to ``url``; record every answer in ``recorder``."""
    stats = SendStatistics(scheduled=len(schedule), in_flight_cap=max_in_flight)
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(max_in_flight)
    pending: set[asyncio.Task[None]] = set()
    counts = {"in_flight": 0, "errors": 0}
    stop = asyncio.Event()

    async with _session(max_in_flight, timeout_s) as session:

        async def one(offset: float, intended: float, plan: ClassPlan, payload: Payload) -> None:
            sent = loop.time()
            recorder.record_send(offset, sent - intended)
            counts["in_flight"] += 1
            stats.max_in_flight = max(stats.max_in_flight, counts["in_flight"])
            first = (
                (lambda: recorder.record_first(plan.label, loop.time() - intended))
                if plan.stream
                else None
            )
            try:
                status, message = await _post(session, url + plan.path, plan, payload, first)
            finally:
                counts["in_flight"] -= 1
                slots.release()
            recorder.record(offset, loop.time() - intended, status, plan.keys(), message)
            stats.answered += 1
            counts["errors"] += status != "ok"

        def report() -> None:
            if progress is not None:
                progress(
                    Progress(
                        elapsed_s=loop.time() - start,
                        duration_s=schedule.duration,
                        scheduled=stats.scheduled,
                        sent=stats.sent,
                        answered=stats.answered,
                        errors=counts["errors"],
                        in_flight=counts["in_flight"],
                    )
                )

        cpu = asyncio.create_task(_sample_cpu(stats, stop))
        start = loop.time() + 0.05
        stats.started_at = time.time() + (start - loop.time())
        next_report = start
        turns = [0] * len(classes)
        for offset, index in _arrivals(schedule):
            intended = start + offset
            delay = intended - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if slots.locked():
                stats.cap_waits += 1
            await slots.acquire()
            plan = classes[index]
            payload = plan.payloads[turns[index] % len(plan.payloads)]
            turns[index] += 1
            task = asyncio.create_task(one(offset, intended, plan, payload))
            pending.add(task)
            task.add_done_callback(pending.discard)
            stats.sent += 1
            stats.last_send_s = loop.time() - start
            if loop.time() >= next_report:
                report()
                next_report = loop.time() + 0.25
        while pending:
            await asyncio.wait(set(pending), timeout=0.25)
            report()
        stats.elapsed_s = loop.time() - start
        stop.set()
        await cpu
    report()
    return stats


async def run_closed_loop(
    url: str,
    plan: ClassPlan,
    recorder: Recorder,
    *,
    duration_s: float,
    concurrency: int = 1,
    timeout_s: float = 60.0,
) -> SendStatistics:
    """``concurrency`` clients each send, wait for the answer, and send again.

    Latency here runs from the actual send (a closed-loop client has no schedule):
    during a server stall it simply sends less, so the stall touches few samples.
    """
    stats = SendStatistics(in_flight_cap=concurrency)
    loop = asyncio.get_running_loop()
    async with _session(concurrency, timeout_s) as session:
        start = loop.time()
        stats.started_at = time.time()
        end = start + duration_s

        async def client_loop(worker: int) -> None:
            turn = worker
            while loop.time() < end:
                payload = plan.payloads[turn % len(plan.payloads)]
                turn += 1
                sent = loop.time()
                recorder.record_send(sent - start, 0.0)
                stats.sent += 1
                status, message = await _post(session, url + plan.path, plan, payload)
                recorder.record(sent - start, loop.time() - sent, status, plan.keys(), message)
                stats.answered += 1

        await asyncio.gather(*(client_loop(i) for i in range(concurrency)))
        stats.elapsed_s = loop.time() - start
    stats.scheduled = stats.sent
    return stats
