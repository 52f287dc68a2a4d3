"""A model instance on a thread of the server (:class:`ThreadInstance`): its backend loaded
in the server process (see ``execution/instances.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from sordino.backends.base import (
    Backend,
    ModelRunOptions,
    ProfilingBackend,
    ReadinessBackend,
    RequestBatchBackend,
    readiness_of,
)
from sordino.backends.calls import CallingBackend
from sordino.backends.decoupled import DecoupledBackend
from sordino.backends.registry import create_backend
from sordino.errors import ModelLoadError, Unavailable
from sordino.execution.decoupled import ThreadResponder
from sordino.execution.devices import Device
from sordino.execution.faults import FaultAction, InjectedFault, perform
from sordino.execution.instance_base import InstanceBase, retrieved
from sordino.execution.model_calls import CallServer, LoopCaller
from sordino.execution.model_thread import ModelThread
from sordino.execution.staging import StagedBatch
from sordino.execution.worker import WorkerError
from sordino.inference import ModelKey, ModelMetadata
from sordino.memory.refs import TensorRef

__all__ = ["UNLOAD_WAIT_S", "ThreadInstance"]

log = logging.getLogger("sordino.workers")

UNLOAD_WAIT_S = 5.0
"""How long closing an instance waits for its model to unload, as a worker process is
given as long to stop before it is killed."""


def _unloaded(subject: str, unloading: asyncio.Future[None]) -> None:
    """An unload that ended after its instance stopped waiting: say how, if it failed."""
    if not unloading.cancelled() and (exc := unloading.exception()) is not None:
        log.warning("instance %s unloaded late, failing: %s: %s", subject, type(exc).__name__, exc)


class ThreadInstance(InstanceBase):
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
        run: ModelRunOptions,
        calls: Callable[[], CallServer | None] | None = None,
        execution_timeout: float = 0.0,
        start_timeout: float = 0.0,
    ) -> None:
        """Build the backend ``run`` says (unloaded); :meth:`open` loads it.

        ``calls`` gives the answerer of the model's calls to other models (BLS).
        ``execution_timeout`` (0: none): a batch running longer fails, and the instance
        goes on in a new thread (the batch's own cannot be stopped: it is left running).
        ``start_timeout`` (0: none): a load taking longer fails (its thread left running).

        Raises :class:`ModelLoadError` for a backend kind this build does not know.
        """
        super().__init__(key, index, tier, device)
        self._path = path
        self._backend = create_backend(
            run,
            name=key.name,
            version=key.version,
            providers=device.providers,
            intra_op_threads=device.intra_op_threads,
            index=index,
        )
        self._pool = ModelThread(f"sordino-{key.name}")
        self._calls = calls
        self._execution_timeout = execution_timeout
        self._start_timeout = start_timeout

    @property
    def backend(self) -> Backend:
        """The in-process backend (tests hold batches on it; profiling swaps its session)."""
        return self._backend

    @property
    def checks_ready(self) -> bool:
        backend = self._backend
        return isinstance(backend, ReadinessBackend) and backend.checks_readiness

    async def _check_ready(self) -> str | None:
        """The model's check, on a daemon thread of its own: not the instance's (a running
        batch must not delay the answer), and not the loop's default executor, whose
        threads ``asyncio.run`` waits for at exit (an ``is_ready()`` that never returns
        would hold up the server's stop)."""
        backend = self._backend
        assert isinstance(backend, ReadinessBackend)
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[str | None] = loop.create_future()

        def settle(why: str | None) -> None:
            if not answer.done():
                answer.set_result(why)

        def check() -> None:
            why = readiness_of(backend)
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(settle, why)

        threading.Thread(target=check, daemon=True, name=f"is-ready-{self.subject}").start()
        return await answer

    async def open(self) -> ModelMetadata:
        loop = asyncio.get_running_loop()
        if isinstance(self._backend, CallingBackend) and self._calls is not None:
            self._backend.set_caller(LoopCaller(loop, self._calls))
        loading = loop.run_in_executor(
            self._pool, self._backend.load, Path(self._path), self.device.target
        )
        if self._start_timeout:
            await asyncio.wait((loading,), timeout=self._start_timeout)
            if not loading.done():
                loading.add_done_callback(retrieved)
                self._leave_thread()
                raise ModelLoadError(
                    f"{self.subject} did not load within {self._start_timeout:g} s in its "
                    "thread, which cannot be stopped: it is left running; raise "
                    "workers.start_timeout, or see what the model waits for"
                )
        await loading
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
            running = loop.run_in_executor(self._pool, call)
            if self._execution_timeout:
                await asyncio.wait((running,), timeout=self._execution_timeout)
                if not running.done():
                    raise self._abandon(running)
            return await running
        except WorkerError:
            raise
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

    def _leave_thread(self) -> None:
        """Go on in a new thread: the one running now is left to the model."""
        self._pool.shutdown(wait=False)  # (it ends once the model returns, if ever)
        self._pool = ModelThread(f"sordino-{self.key.name}")

    def _abandon(self, running: asyncio.Future[dict[str, TensorRef]]) -> WorkerError:
        """The batch ``running`` ran over the execution timeout: leave its thread to it,
        go on in a new one, and say so (a worker process is killed and replaced then)."""
        self._leave_thread()
        running.add_done_callback(retrieved)
        self.failures += 1
        message = (
            f"the batch ran over {self._execution_timeout:g} s (workers.execution_timeout) "
            "in its thread, which cannot be stopped: it is left running, and the instance "
            "goes on in a new thread"
        )
        log.warning("instance %s: %s", self.subject, message)
        return WorkerError("timeout", message)

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
        """Unload the model in its own thread, after the batch it runs (a model's
        ``finalize`` may take its time, or never return: it ran on the event loop before,
        and one that hung wedged the whole server, health checks included). A thread
        cannot be killed: one still unloading after :data:`UNLOAD_WAIT_S` is left to end
        on its own, said in the log, as a worker process is killed then."""
        self.state = "stopped"
        loop = asyncio.get_running_loop()
        unloading = loop.run_in_executor(self._pool, self._backend.unload)
        self._pool.shutdown(wait=False)
        try:
            await asyncio.wait_for(asyncio.shield(unloading), UNLOAD_WAIT_S)
        except TimeoutError:
            unloading.add_done_callback(functools.partial(_unloaded, self.subject))
            log.warning(
                "instance %s did not unload within %g s (its model's finalize, or a batch "
                "still running): left to end in its thread",
                self.subject,
                UNLOAD_WAIT_S,
            )
