"""Alert channels: every guardian record, delivered off the request path.

Channels (``--alert-channel``, ``self_healing.alert_channels``):

- ``slack:#channel``: a Slack incoming-webhook message (``{"text", "channel"}``) POSTed
  to the URL in ``$SORDINO_SLACK_WEBHOOK``; while that variable is unset the channel is
  still accepted: one warning at start-up names the variable, and each of its alerts is
  written to the server log instead (never dropped; the journal has every record too);
- ``webhook:URL``: the record as JSON, POSTed to ``URL``;
- ``file:PATH``: the record as one JSON line appended to ``PATH``;
- ``log``: a warning in the server log.

:meth:`AlertSender.send` only queues (bounded; the oldest alert is dropped when a
channel falls far behind). One task per channel delivers, retrying a failed delivery
with exponential backoff, over its own thread pool, so a dead or slow channel never
slows serving, the event loop or the other channels.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sordino.clock import Clock
from sordino.config.addresses import http_url_problem
from sordino.errors import ConfigError

__all__ = ["SLACK_ENV", "AlertSender"]

log = logging.getLogger("sordino.guardian")

SLACK_ENV = "SORDINO_SLACK_WEBHOOK"
_QUEUE = 100


class _Channel:
    def __init__(self, spec: str) -> None:
        self.spec = spec
        kind, _, rest = spec.partition(":")
        self.kind = kind
        self.target = rest
        self.url: str | None = None
        if kind == "slack":
            # A channel named before its webhook is set up must not stop the server:
            # its alerts go to the log until the URL is there (a restart with it set).
            self.url = os.environ.get(SLACK_ENV) or None
            if self.url is None:
                log.warning(
                    "alert channel %s: $%s is not set, so its alerts are written to the "
                    "server log (and the journal) instead; set %s to the Slack "
                    "incoming-webhook URL and restart to deliver them to Slack",
                    spec,
                    SLACK_ENV,
                    SLACK_ENV,
                )
        elif kind == "webhook":
            problem = http_url_problem(rest)
            if problem is not None:
                raise ConfigError(f"alert channel {spec!r}: the webhook URL {rest!r}: {problem}")
            self.url = rest
        elif kind == "file":
            # Found at start-up, not at the first alert (which would retry, then be dropped).
            path = Path(rest).expanduser()
            if path.is_dir():
                raise ConfigError(f"alert channel {spec!r}: {path} is a folder; name a file")
            if not path.parent.is_dir():
                raise ConfigError(
                    f"alert channel {spec!r}: the folder {path.parent} does not exist; "
                    "create it, or name a file in a folder that exists"
                )
        self.queue: asyncio.Queue[dict[str, Any]] | None = None
        self.sent = 0
        self.failed = 0

    def deliver(self, record: dict[str, Any], timeout_s: float) -> None:
        """Deliver ``record`` once (in a pool thread); raise on failure."""
        if self.kind == "log":
            log.warning("guardian: %s", record.get("explanation", record))
            return
        if self.kind == "slack" and self.url is None:
            log.warning(
                "guardian alert for %s (logged, not sent: no webhook URL): %s",
                self.spec,
                record.get("explanation", record),
            )
            return
        if self.kind == "file":
            with Path(self.target).expanduser().open("a", encoding="utf-8") as out:
                out.write(json.dumps(record, default=str) + "\n")
            return
        if self.kind == "slack":
            body: dict[str, Any] = {
                "channel": self.target,
                "text": f":rotating_light: sordino guardian: {record.get('explanation', '')}",
            }
        else:
            body = record
        assert self.url is not None
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body, default=str).encode(),
            method="POST",
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            response.read()


class AlertSender:
    """Queues records per channel and delivers them with retry and backoff."""

    def __init__(
        self,
        channels: Sequence[str],
        *,
        clock: Clock,
        retries: int = 4,
        backoff_s: float = 0.5,
        timeout_s: float = 5.0,
    ) -> None:
        self._channels = [_Channel(spec) for spec in channels]
        self._clock = clock
        self._retries = retries
        self._backoff = backoff_s
        self._timeout = timeout_s
        self._pool: ThreadPoolExecutor | None = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        if not self._channels:
            return
        self._pool = ThreadPoolExecutor(
            max_workers=len(self._channels), thread_name_prefix="sordino-alert"
        )
        loop = asyncio.get_running_loop()
        for channel in self._channels:
            channel.queue = asyncio.Queue(_QUEUE)
            self._tasks.append(loop.create_task(self._deliver(channel)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._pool is not None:
            # A delivery stuck on a dead host ends with its own timeout; do not wait for it.
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def send(self, record: dict[str, Any]) -> None:
        """Queue ``record`` on every channel; never blocks."""
        for channel in self._channels:
            queue = channel.queue
            if queue is None:
                continue
            if queue.full():
                queue.get_nowait()
                channel.failed += 1
            queue.put_nowait(record)

    def counts(self) -> tuple[int, int]:
        """(alerts delivered, failed delivery attempts and alerts dropped) over every channel."""
        return sum(c.sent for c in self._channels), sum(c.failed for c in self._channels)

    async def _deliver(self, channel: _Channel) -> None:
        assert channel.queue is not None
        loop = asyncio.get_running_loop()
        while True:
            record = await channel.queue.get()
            delay = self._backoff
            for attempt in range(self._retries + 1):
                try:
                    await loop.run_in_executor(self._pool, channel.deliver, record, self._timeout)
                    channel.sent += 1
                    break
                except Exception as exc:
                    channel.failed += 1
                    if attempt == self._retries:
                        log.warning(
                            "alert to %s failed %d times, dropped: %s",
                            channel.spec,
                            attempt + 1,
                            exc,
                        )
                        break
                    await self._clock.sleep(delay)
                    delay *= 2
