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
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sordino.backends.base import Backend, ProfilingBackend, RequestBatchBackend
from sordino.backends.calls import CallingBackend
from sordino.backends.decoupled import DecoupledBackend
from sordino.backends.registry import create_backend
from sordino.clock import Clock
from sordino.config import WorkersConfig
from sordino.errors import Unavailable
from sordino.events import EventSink
from sordino.execution.backoff import RestartBackoff, start_again
from sordino.execution.decoupled import ThreadResponder
from sordino.execution.devices import Device
from sordino.execution.faults import FaultAction, InjectedFault, perform
from sordino.execution.messages import ProfileStart, ProfileStop, ProfileStopped
from sordino.execution.model_calls import CallServer, LoopCaller
from sordino.execution.staging import StagedBatch, read_outputs
from sordino.execution.worker import WorkerError, WorkerLost, WorkerProcess
from sordino.execution.worker_main import WorkerSpec
from sordino.inference import ModelKey, ModelMetadata
from sordino.memory.refs import TensorRef
from sordino.records import InstanceState, WorkerStatistics

__all__ = ["ProcessInstance", "ThreadInstance"]

log = logging.getLogger("sordino.workers")


class _Base:
    isolation = "thread"

    def __init__(self, key: ModelKey, index: int, tier: str, device: Device) -> None:
        self.key = key
        self.index = index
        self.tier = tier
        self.device = device
        self.state: InstanceState = "starting"
        self._busy_since: float | None = None
        self._busy_s = 0.0
        self.hop_bytes = 0
        """Bytes of batch inputs and outputs that crossed the worker hop (process only)."""
        self.batches = self.failures = self.restarts = 0
        self.last_cause = ""
        self.share = 1.0
        """The share of batches this instance is offered (below 1 while it ramps up)."""
        self.credit = 0.0

    @property
    def subject(self) -> str:
        return f"{self.key.name}/{self.index}"

    @property
    def busy(self) -> bool:
        """Whether a batch is running on this instance now (the executor sets it)."""
        return self._busy_since is not None

    @busy.setter
    def busy(self, value: bool) -> None:
        # Busy time is measured on the performance counter, not the runtime's clock: it
        # is a measurement of real work (the utilisation figures), never a deadline.
        if value and self._busy_since is None:
            self._busy_since = time.perf_counter()
        elif not value and self._busy_since is not None:
            self._busy_s += time.perf_counter() - self._busy_since
            self._busy_since = None

    @property
    def busy_s(self) -> float:
        """Seconds spent running batches so far, the running batch's time included."""
        since = self._busy_since
        return self._busy_s + (time.perf_counter() - since if since is not None else 0.0)

    @property
    def serving(self) -> bool:
        return self.state == "ready"

    def _pid(self) -> int | None:
        return None

    @property
    def pid(self) -> int | None:
        """The process serving now (None in the server's own process or between two)."""
        return self._pid()

    @property
    def profiling(self) -> bool:
        """Whether this instance serves from a profiling session now."""
        return False

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            model=self.key.name,
            version=self.key.version,
            index=self.index,
            tier=self.tier,
            device=self.device.name,
            isolation=self.isolation,
            state=self.state,
            busy=self.busy,
            pid=self._pid(),
            restarts=self.restarts,
            batches=self.batches,
            failures=self.failures,
            last_cause=self.last_cause,
            profiling=self.profiling,
            busy_s=self.busy_s,
            hop_bytes=self.hop_bytes,
        )


class ThreadInstance(_Base):
    """A backend loaded in the server process, run on a thread of its own."""

    isolation = "thread"

    def __init__(
        self,
        key: ModelKey,
        index: int,
        tier: str,
        device: Device,
        path: str,
        *,
        backend: str,
        thread_spinning: bool = False,
        calls: Callable[[], CallServer | None] | None = None,
    ) -> None:
        """Build the ``backend`` kind's backend (unloaded); :meth:`open` loads it.

        ``calls`` gives the answerer of the model's calls to other models (BLS).

        Raises :class:`ModelLoadError` for a backend kind this build does not know.
        """
        super().__init__(key, index, tier, device)
        self._path = path
        self._backend = create_backend(
            backend,
            name=key.name,
            version=key.version,
            providers=device.providers,
            intra_op_threads=device.intra_op_threads,
            thread_spinning=thread_spinning,
            index=index,
        )
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"sordino-{key.name}")
        self._calls = calls

    @property
    def backend(self) -> Backend:
        """The in-process backend (tests hold batches on it; profiling swaps its session)."""
        return self._backend

    async def open(self) -> ModelMetadata:
        loop = asyncio.get_running_loop()
        if isinstance(self._backend, CallingBackend) and self._calls is not None:
            self._backend.set_caller(LoopCaller(loop, self._calls))
        await loop.run_in_executor(
            self._pool, self._backend.load, Path(self._path), self.device.target
        )
        self.state = "ready"
        return self._backend.metadata

    async def run(self, batch: StagedBatch, fault: FaultAction | None) -> dict[str, TensorRef]:
        responder = None
        if batch.channel is not None:
            responder = ThreadResponder(asyncio.get_running_loop(), batch.channel)
        cancels = batch.context.cancels
        cancelled: set[int] = set()  # added on the loop, read from the model's threads

        def call() -> dict[str, TensorRef]:
            if fault is not None:
                perform(fault, in_process=True)
            backend = self._backend
            requests = batch.context.requests
            if responder is not None:
                if not isinstance(backend, DecoupledBackend):
                    raise RuntimeError(f"the {type(backend).__name__} backend is not decoupled")
                backend.infer_decoupled(batch.arrays, batch.request_rows, responder, requests)
                return {}
            if isinstance(backend, RequestBatchBackend) and (batch.request_rows or requests):
                outputs = backend.infer_requests(
                    batch.arrays, batch.request_rows, requests, cancelled.__contains__
                )
            else:
                outputs = backend.infer(batch.arrays)
            return {name: TensorRef(array) for name, array in outputs.items()}

        loop = asyncio.get_running_loop()
        self.batches += 1
        if cancels is not None:
            cancels.bind(cancelled.add)
        try:
            return await loop.run_in_executor(self._pool, call)
        except MemoryError as exc:
            self.failures += 1
            raise WorkerError("oom", f"MemoryError: {exc}") from None
        except InjectedFault as exc:
            self.failures += 1
            raise WorkerError("fault", f"{type(exc).__name__}: {exc}") from None
        except Exception as exc:
            self.failures += 1
            raise WorkerError("error", f"{type(exc).__name__}: {exc}") from None
        finally:
            if cancels is not None:
                cancels.bind(None)

    @property
    def profiling(self) -> bool:
        backend = self._backend
        return isinstance(backend, ProfilingBackend) and backend.profiling

    def _profiler(self) -> ProfilingBackend:
        backend = self._backend
        if not isinstance(backend, ProfilingBackend):
            raise Unavailable(f"the {type(backend).__name__} backend cannot profile")
        return backend

    async def start_profiling(self, prefix: str) -> None:
        """Swap in a profiling session (built off the instance's thread: batches go on)."""
        profiler = self._profiler()
        await asyncio.get_running_loop().run_in_executor(None, profiler.start_profiling, prefix)

    async def stop_profiling(self) -> tuple[str, int]:
        """Put the serving session back once the running batch is done; see the backend."""
        profiler = self._profiler()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, profiler.stop_profiling)

    async def aclose(self) -> None:
        self.state = "stopped"
        self._pool.shutdown(wait=False)
        self._backend.unload()


class ProcessInstance(_Base):
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

        The supervisor hears of the exit a moment later; until then the instance must
        not look "ready" with no live worker, or a batch retried at once would find no
        instance to wait for.
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
