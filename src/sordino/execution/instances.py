"""Model instances: a supervised worker process, or a backend on a thread of the server.

A :class:`ProcessInstance` owns one worker slot. When its worker exits, is killed,
stops sending heartbeats or overruns a batch, the instance records why, starts a
replacement (which loads and warms up before it says ready) and only then takes
traffic again. The replacement starts at once when the lost worker had served well;
only a crash loop (failing while starting or before healthy service) waits out a
growing backoff on the runtime's clock (``execution/backoff.py``). Every failure and
every restart is an event with its cause.

Both build their backend with :func:`sordino.backends.registry.create_backend` from
the model's ``backend`` kind (a process instance through its :class:`WorkerSpec`).
Both run a :class:`StagedBatch` (see ``execution/staging.py``): a thread instance on
its arrays, a process instance on its handles in the shared-memory arena.

Both kinds can be profiled (``start_profiling`` / ``stop_profiling``): a thread
instance swaps its backend's session itself, a process instance asks its worker to,
between batches (see ``execution/messages.py``).

Here: :class:`ProcessInstance`; :class:`ThreadInstance` is ``thread_instance.py``'s, what
both share ``instance_base.py``'s.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

from sordino.clock import Clock
from sordino.config import WorkersConfig
from sordino.events import EventSink
from sordino.execution.backoff import RestartBackoff, start_again
from sordino.execution.devices import Device
from sordino.execution.faults import FaultAction
from sordino.execution.instance_base import InstanceBase
from sordino.execution.messages import LogChange, ProfileStart, ProfileStop, ProfileStopped
from sordino.execution.model_calls import CallServer
from sordino.execution.staging import StagedBatch, read_outputs
from sordino.execution.worker import WorkerError, WorkerLost, WorkerProcess
from sordino.execution.worker_main import WorkerSpec
from sordino.inference import ModelKey, ModelMetadata
from sordino.memory.refs import TensorRef

__all__ = ["ProcessInstance"]

log = logging.getLogger("sordino.workers")


class ProcessInstance(InstanceBase):
    """A worker-process slot: keeps one healthy worker running, restarting as needed."""

    isolation = "process"

    def __init__(
        self,
        key: ModelKey,
        index: int,
        tier: str,
        device: Device,
        spec: WorkerSpec,
        *,
        settings: WorkersConfig,
        clock: Clock,
        events: EventSink,
        notify: Callable[[], None],
        calls: Callable[[], CallServer | None] | None = None,
    ) -> None:
        super().__init__(key, index, tier, device)
        self._spec = spec
        self._calls = calls
        self._settings = settings
        self._clock = clock
        self._events = events
        self._notify = notify
        self._backoff = RestartBackoff(
            settings.restart_backoff,
            settings.restart_backoff_max,
            healthy_after_s=settings.restart_backoff_reset,
            healthy_batches=settings.restart_backoff_reset_batches,
        )
        self._worker: WorkerProcess | None = None
        self._watch: asyncio.Task[None] | None = None
        self._closing = False
        self._profiled: WorkerProcess | None = None

    def _pid(self) -> int | None:
        return self._worker.pid if self._worker is not None else None

    @property
    def spec(self) -> WorkerSpec:
        """What its worker processes start from."""
        return self._spec

    @property
    def serving(self) -> bool:
        return self.state == "ready" and self._worker is not None and self._worker.alive

    @property
    def checks_ready(self) -> bool:
        worker = self._worker
        return worker is not None and worker.checks_ready

    async def _check_ready(self) -> str | None:
        worker = self._worker
        if worker is None:
            raise WorkerLost("no worker serves now")
        return await worker.check_ready()

    async def open(self) -> ModelMetadata:
        """Start the first worker; raise :class:`ModelLoadError` if it cannot load."""
        metadata = await self._start_worker()
        self._watch = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"sordino-watch-{self.subject}"
        )
        return metadata

    async def run(self, batch: StagedBatch, fault: FaultAction | None) -> dict[str, TensorRef]:
        """Run ``batch``; its outputs are views of the arena blocks the batch holds."""
        worker = self._worker
        if worker is None or not self.serving:
            raise WorkerLost("the worker is restarting")
        assert batch.allocate is not None and batch.buffer is not None
        self.batches += 1
        try:
            outputs, _ = await worker.run(
                batch.handles,
                batch.space,
                fault,
                batch.allocate,
                self._settings.execution_timeout,
                batch.segment,
                batch.request_rows,
                channel=batch.channel,
                requests=batch.context.requests,
                cancels=batch.context.cancels,
            )
        except WorkerError:
            # A batch the model failed while its worker lives; one whose failure killed
            # the worker (an allocation that failed) is counted with the death.
            if worker.alive:
                self.failures += 1
            raise
        except WorkerLost:
            # Counted once, as the death the supervisor sees, however many batches it took.
            self._lost(worker)
            raise
        if worker is self._worker:
            self._backoff.served()
        self.hop_bytes += sum(h.nbytes for h in batch.handles.values()) + sum(
            h.nbytes for h in outputs.values()
        )
        return read_outputs(batch.buffer, outputs)

    def _lost(self, worker: WorkerProcess) -> None:
        """Stop routing to ``worker`` now that it is gone; the supervisor replaces it.

        Called by the worker itself (``on_gone``) as soon as it is killed, its pipe
        breaks or it exits; the supervisor hears of the exit a moment later. Until then
        the instance must not look "ready" with no live worker, or a batch sent or
        retried meanwhile would find no instance to wait for and fail ("failed on every
        device it runs on").
        """
        if worker is self._worker and not worker.alive and self.state == "ready":
            self.state = "restarting"
            self._notify()

    @property
    def profiling(self) -> bool:
        return self._profiled is not None and self._profiled.alive

    async def start_profiling(self, prefix: str) -> None:
        """Have the worker serve from a profiling session, once its running batch is done.

        Raises :class:`WorkerLost` when no worker serves now or it is lost meanwhile,
        :class:`WorkerError` when the worker cannot open the session or does not answer
        within ``workers.start_timeout``.
        """
        worker = self._worker
        if worker is None or not self.serving:
            raise WorkerLost(f"the instance is {self.state}, not serving")
        await worker.call(ProfileStart(prefix), timeout_s=self._settings.start_timeout)
        self._profiled = worker

    async def stop_profiling(self) -> tuple[str, int]:
        """End profiling in the worker that started it; return its trace file and batches.

        Raises :class:`WorkerLost` if that worker is gone (its trace with it), even when
        a replacement serves by now.
        """
        worker, self._profiled = self._profiled, None
        if worker is None:
            raise WorkerLost("profiling was not started on this instance")
        reply = await worker.call(ProfileStop(), timeout_s=self._settings.start_timeout)
        if not isinstance(reply, ProfileStopped):
            raise WorkerError("error", f"the worker answered profile_stop with {reply!r}")
        return reply.path, reply.batches

    async def tell_log(self, settings: dict[str, Any]) -> None:
        """Have the worker log as the server now does (a replacement starts so anyway);
        a worker lost meanwhile, or one that does not answer in time, is let be."""
        worker = self._worker
        if worker is None or not worker.alive:
            return
        # (log_file is the server's: it cannot change, and a worker writes where it does.)
        change = LogChange(tuple((k, v) for k, v in settings.items() if k != "log_file"))
        try:
            await worker.call(change, timeout_s=self._settings.start_timeout)
        except WorkerLost:
            pass  # its replacement starts with the server's settings
        except WorkerError as exc:
            log.warning("worker %s did not take the new log settings: %s", self.subject, exc)

    def kill(self, cause: str) -> None:
        """Kill the current worker (it is then replaced as after any failure)."""
        if self._worker is not None:
            self._worker.kill(cause)

    async def aclose(self) -> None:
        self._closing = True
        self.state = "stopped"
        if self._watch is not None:
            self._watch.cancel()
        if self._worker is not None:
            await self._worker.stop()

    # -- supervision -----------------------------------------------------------------

    def _restart_failed(self, cause: str) -> None:
        self.failures += 1
        self.last_cause = cause

    async def _start_worker(self) -> ModelMetadata:
        self.state = "starting"
        worker = WorkerProcess(self._spec, self._clock, self._calls)
        worker.on_gone = functools.partial(self._lost, worker)
        self._worker = worker
        metadata = await worker.start(self._settings.start_timeout)
        self._backoff.started(self._clock.now())
        self.state = "ready"
        self._notify()
        return metadata

    async def _supervise(self) -> None:
        interval = max(0.02, min(1.0, self._settings.heartbeat_timeout / 4))
        while not self._closing:
            worker = self._worker
            assert worker is not None
            cause = await self._watch_worker(worker, interval)
            if self._closing:
                return
            self.failures += 1  # every death once, whether or not a batch was running
            failed_at = self._clock.now()
            self.state = "restarting"
            self.last_cause = cause
            self._notify()
            delay = self._backoff.next_delay(failed_at)
            crash_loop = self._backoff.crash_loop
            log.warning(
                "worker %s (pid %s) %s; restarting %s",
                self.subject,
                worker.pid,
                cause,
                f"in {delay:g} s (crash loop: {crash_loop} failures before serving)"
                if delay
                else "now",
            )
            self._events.emit(
                "worker_failed",
                self.subject,
                cause,
                version=self.key.version,
                device=self.device.name,
                pid=worker.pid,
                restart_in_s=delay,
                crash_loop=crash_loop,
            )
            await start_again(
                self._start_worker,
                delay,
                backoff=self._backoff,
                clock=self._clock,
                events=self._events,
                subject=self.subject,
                closing=lambda: self._closing,
                failed=self._restart_failed,
            )
            if self._closing:
                return
            self.restarts += 1
            assert self._worker is not None
            self._events.emit(
                "worker_restarted",
                self.subject,
                cause,
                version=self.key.version,
                device=self.device.name,
                pid=self._worker.pid,
                restarts=self.restarts,
                downtime_s=self._clock.now() - failed_at,
                load_s=self._worker.load_s,
            )

    async def _watch_worker(self, worker: WorkerProcess, interval: float) -> str:
        """Return the cause once ``worker`` is gone; kill it if its heartbeat stops."""
        timeout = self._settings.heartbeat_timeout
        while not worker.dead.done():
            tick = asyncio.ensure_future(self._clock.sleep(interval))
            waiting: set[asyncio.Future[Any]] = {tick, worker.dead}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            tick.cancel()
            silent = self._clock.now() - worker.last_beat
            if not worker.dead.done() and worker.alive and silent > timeout:
                worker.kill(f"hang: no heartbeat for {silent:.1f} s (timeout {timeout:g} s)")
            if not worker.alive:
                # Killed (hang, timeout): stop routing to it before the exit is seen.
                self._lost(worker)
        return worker.dead.result()
