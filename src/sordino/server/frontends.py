"""The front-end processes of one server (``server.frontends`` > 1): HTTP and gRPC.

``server.frontends`` counts the processes that read client connections. With N > 1
:class:`Frontends` starts N front ends (``server/frontend_main.py``), each listening on
the same HTTP and gRPC host and port with ``SO_REUSEPORT``, and the engine process reads
no client connection: it holds both ports (bound, never listened on:
``listen.reserve_port``) and answers only what the front ends send over the link —
decoded inference requests, forwarded gRPC calls and streams, and the connections
handed over for every other route. :class:`Frontends` keeps them running:

- start: the engine's link (``server/engine_link.py``) listens, the processes start
  and start-up returns once each has said hello, which it does once it listens on
  both ports (one that exits first stops start-up with its exit status): when
  ``sordino start`` says it is listening, every front end accepts;
- a front end that ends while the server runs is started again (a warning says so),
  and so is one that stops answering — its link silent for 10 s (each beats every
  second), it is killed first:
  its connections are gone (and so is what the kernel had queued for it but it had
  not accepted), new ones go to the others; the engine and the other front ends go
  on unaffected. Were all of them restarting at once, the ports stay the engine's
  (no other program can take them) and a new connection is refused until one
  listens again;
- stop (:meth:`Frontends.drain`): SIGTERM to each, which stops accepting and answers
  what it has in flight; the engine waits for them (bounded) before it drains its own
  queues; :meth:`Frontends.close` then closes the link. The front ends run in their own
  process group, so Ctrl-C at a terminal reaches the engine only and the stop keeps
  this order (a SIGTERM to the whole group, as a service manager sends, stops each
  front end the same way on its own);
- the engine's end: the processes see EOF on the link (and get the parent-death
  signal on Linux) and end.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from typing import TYPE_CHECKING

from sordino.config.server import ServerConfig
from sordino.server.engine_link import Adopt, EngineLink
from sordino.server.frontend_main import FrontendSpec
from sordino.server.runtime import Runtime

if TYPE_CHECKING:
    from sordino.server.grpc import InferenceServicer

__all__ = ["Frontends", "default_frontends", "frontend_count"]

log = logging.getLogger("sordino.frontends")

_START_S = 60.0  # longest a front end may take to connect (imports on a busy machine)
_WATCH_S = 0.25  # how often the processes are checked
_STEADY_S = 10.0  # a front end that ran this long before it ended is restarted at once
_SILENT_S = 10.0  # a front end that sent nothing this long is hung (it beats every second)


def default_frontends(cores: int | None) -> int:
    """The front ends ``server.frontends`` means when unset, on ``cores`` CPU cores.

    1 (one process) below 8 cores, else a front end per 4 cores, at most 4. With N > 1
    the engine's loop (the service, the scheduler, the worker pipe) is one core that
    reads no connection: every request reaches it decoded, at about two thirds of the
    CPU of one it reads itself (0.114 against 0.171 ms on W1), and that, not the front
    ends, is the ceiling — on W1 one front end's core carries more than the engine's
    (0.09 ms a request), so 2 already reach it and more are headroom for bodies that
    cost more to decode (JSON). The split costs a process and a hop more per request:
    below 8 cores the engine, the front ends and the workers would share too few cores
    (the CPU model of ``bench/bench_frontends.py``, docs/benchmarks.md).
    """
    cores = cores or 1
    return 1 if cores < 8 else min(4, cores // 4)


def frontend_count(settings: ServerConfig) -> int:
    """The number of front ends (HTTP and gRPC) ``settings`` ask for (the default from
    the cores; 1 where more cannot work: with TLS, or off Linux)."""
    if settings.frontends is not None:
        return settings.frontends
    if settings.tls is not None or not sys.platform.startswith("linux"):
        return 1
    return default_frontends(os.cpu_count())


class Frontends:
    """The N front-end processes and their link (see the module's docstring)."""

    def __init__(
        self,
        runtime: Runtime,
        adopt: Adopt,
        *,
        host: str,
        port: int,
        count: int,
        servicer: InferenceServicer | None = None,
    ) -> None:
        """``servicer``: the engine's gRPC servicer, which answers the calls the front
        ends forward (their gRPC port is set in :attr:`spec` once the engine's is bound)."""
        settings = runtime.config.server
        connections = settings.max_connections or _max_connections()  # HTTP's, and gRPC's
        self.count = count
        self.link = EngineLink(runtime, adopt, servicer)
        self.spec = FrontendSpec(
            host=host,
            port=port,
            link=self.link.link_path,
            handover=self.link.handover_path,
            guard={
                "max_connections": connections,
                "max_per_client": settings.max_connections_per_client,
                "header_timeout": settings.header_timeout,
                "max_header_size": settings.max_header_size,
                "body_timeout": settings.body_timeout,
                "max_pending_bodies": settings.max_pending_bodies,
                "max_pending_body_size": max(
                    settings.max_pending_body_size // count, settings.max_request_size
                ),
                "body_min_rate": settings.body_min_rate,
                "body_rate_grace": settings.body_rate_grace,
                "monitoring_connections": settings.monitoring_connections,
            },
            max_request_size=settings.max_request_size,
            keep_alive_timeout=settings.keep_alive_timeout,
            shutdown_timeout=settings.shutdown_timeout,
            grpc_options={
                "max_receive": settings.max_request_size,
                "handshake_ms": max(1, round(settings.header_timeout * 1000)),
                "accept_ahead": settings.grpc_accept_ahead,
                "max_connections": connections,
            },
        )
        self.processes: list[subprocess.Popen[bytes]] = []
        self.restarts = 0
        self._stopping = False
        self._watch: asyncio.Task[None] | None = None

    def pids(self) -> list[int]:
        """The front ends' process ids, now."""
        return [process.pid for process in self.processes]

    async def start(self) -> None:
        """Start the link and the processes; return once every one listens (its hello)."""
        await self.link.start()
        self.processes = [self._spawn() for _ in range(self.count)]
        await self._connected(self.processes)
        self._watch = asyncio.get_running_loop().create_task(self._supervise())

    def _spawn(self) -> subprocess.Popen[bytes]:
        # A process group of its own: Ctrl-C at a terminal signals the engine alone, which
        # then stops the front ends in order (they stop accepting first; see drain()),
        # instead of each ending at once and the supervisor seeing them die. It still
        # ends with the engine (EOF on the link, the parent-death signal).
        return subprocess.Popen(
            [sys.executable, "-m", "sordino.server.frontend_main", self.spec.to_json()],
            stdin=subprocess.DEVNULL,
            process_group=0,
        )

    async def _connected(self, processes: list[subprocess.Popen[bytes]]) -> None:
        deadline = asyncio.get_running_loop().time() + _START_S
        want = {process.pid for process in processes}
        while not want <= self.link.pids():
            for process in processes:
                status = process.poll()
                if status is not None:
                    raise RuntimeError(
                        f"a front-end process (pid {process.pid}) ended during start-up with "
                        f"status {status}; its error is above"
                    )
            if asyncio.get_running_loop().time() > deadline:
                raise RuntimeError(f"front-end processes did not start within {_START_S:.0f} s")
            self.link.hello.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.link.hello.wait(), _WATCH_S)

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        count = len(self.processes)
        started = [loop.time()] * count
        failures = [0] * count  # ends in a row, each soon after its start
        due: list[float | None] = [None] * count  # when a dead one is started again
        now = loop.time()
        while not self._stopping:
            await asyncio.sleep(_WATCH_S)
            # After a stall of the engine's own loop the front ends' beats wait unread:
            # no one is judged silent on a round that came that late.
            late, now = loop.time() - now > 1.0 + _WATCH_S, loop.time()
            for index, process in enumerate(self.processes):
                if self._stopping:
                    return
                restart = due[index]
                if restart is not None:
                    if now >= restart:
                        due[index], started[index] = None, now
                        self.restarts += 1
                        self.processes[index] = self._spawn()
                    continue
                status = process.poll()
                if status is None:
                    if not late:
                        self._end_if_silent(process)
                    continue
                # One that keeps ending soon after its start is restarted less often.
                failures[index] = failures[index] + 1 if now - started[index] < _STEADY_S else 0
                delay = min(0.5 * 2 ** (failures[index] - 1), 30.0) if failures[index] else 0.0
                log.warning(
                    "front-end process %d ended with status %s; starting another in %.1f s",
                    process.pid,
                    status,
                    delay,
                )
                due[index] = now + delay

    def _end_if_silent(self, process: subprocess.Popen[bytes]) -> None:
        """SIGKILL a front end its link has not heard from in ``_SILENT_S`` (it beats
        every second): stopped (``SIGSTOP``, a debugger) or hung, it no longer accepts,
        yet the kernel goes on queueing the new connections it spreads to it, which
        wait for ever. Once it is dead, the loop above starts another."""
        heard = self.link.heard().get(process.pid)
        silent = time.monotonic() - heard if heard is not None else 0.0
        if silent > _SILENT_S:
            log.warning(
                "front-end process %d sent nothing for %.0f s (stopped or hung): killed",
                process.pid,
                silent,
            )
            with contextlib.suppress(ProcessLookupError):
                process.kill()

    async def drain(self, timeout_s: float) -> None:
        """Stop every front end: they stop accepting, answer what is in flight, and end
        (killed after ``timeout_s``)."""
        self._stopping = True
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while any(process.poll() is None for process in self.processes):
            if loop.time() > deadline:
                for process in self.processes:
                    if process.poll() is None:
                        log.warning("front-end process %d did not stop; killed", process.pid)
                        process.kill()
                        process.wait()
                break
            await asyncio.sleep(0.02)

    async def close(self) -> None:
        """Stop the processes at once (if still running) and close the link."""
        if any(process.poll() is None for process in self.processes):
            await self.drain(0.0)
        await self.link.close()


def _max_connections() -> int:
    from sordino.server.connection_guard import default_max_connections

    return default_max_connections()
