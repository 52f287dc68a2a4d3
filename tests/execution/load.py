"""A steady load from real HTTP clients, and waiting on what the server reports."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx
import numpy as np

from sordino.config import ModelConfig, RuntimeConfig
from sordino.events import Event
from sordino.inference import ModelKey
from sordino.memory.refs import Tensors
from sordino.models.repository import ModelSource, builtin_sources
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

BODY = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}


def digits(**config: object) -> list[ModelSource]:
    """The built-in digits classifier with extra model configuration."""
    source = next(s for s in builtin_sources() if s.name == "digits-classifier")
    updated = ModelConfig.model_validate({**source.config.model_dump(), **config})
    return [replace(source, config=updated)]


@dataclass
class OnlyInstance:
    """A server whose digits classifier has one worker, and what a test drives it with:
    the executor (call its coroutines through ``server.call``), the model's key and a
    one-row batch."""

    server: RunningServer
    executor: Any
    key: ModelKey
    rows: Tensors

    async def replace(self) -> None:
        """Have the only worker replaced (as the guardian's restart_worker does)."""
        assert await self.executor.restart_instance(self.key, 0, cause="replaced by the test")


@contextmanager
def only_instance(restart_backoff: str) -> Iterator[OnlyInstance]:
    """Serve the digits classifier with one worker and ``workers.restart_backoff``."""
    config = RuntimeConfig.model_validate({"workers": {"restart_backoff": restart_backoff}})
    with serve_in_thread(config, digits(instance_count=1)) as server:
        key = server.runtime.get("digits-classifier").key
        rows = Tensors.of({"pixels": np.zeros((1, 64), np.float32)})
        yield OnlyInstance(server, server.runtime.executor, key, rows)


class Load:
    """``clients`` threads, each sending one request after another until stopped."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self._url = url + "/v2/models/digits-classifier/infer"
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.ok = 0
        self.errors: list[str] = []
        self._threads = [threading.Thread(target=self._client) for _ in range(clients)]

    def __enter__(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)

    def _client(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self._stop.is_set():
                try:
                    response = client.post(self._url, json=BODY)
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.errors.append(repr(exc))
                    continue
                with self._lock:
                    if response.status_code == 200:
                        self.ok += 1
                    else:
                        self.errors.append(f"{response.status_code} {response.text}")

    def wait_ok(self, more: int, timeout: float = 60) -> None:
        """Wait until ``more`` further requests have succeeded."""
        target = self.ok + more
        wait_until(lambda: self.ok >= target, timeout, f"{more} more successful requests")


def wait_until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    """:func:`tests.waiting.wait_for` with the timeout first, as these tests call it."""
    wait_for(predicate, what, timeout)


def events(server: RunningServer, kind: str, since: int = 0) -> list[Event]:
    """Events of ``kind`` (after the first ``since`` events of all kinds)."""
    return [e for e in list(server.runtime.events.recent())[since:] if e.kind == kind]


def mark(server: RunningServer) -> int:
    """A position in the event stream to count from."""
    return len(server.runtime.events.recent())


def worker(server: RunningServer, index: int) -> object:
    """The statistics of instance ``index`` of the digits classifier."""
    return next(
        w
        for w in server.runtime.executor.statistics().workers
        if w.model == "digits-classifier" and w.index == index
    )
