"""A model instance as a Ray actor: the supervised slot the executor routes to.

:class:`RayInstance` is the server's side of one actor (the actor itself,
:class:`~sordino.execution.ray_actor.ModelActor`, is ``ray_actor.py``'s), with the
contract of :class:`~sordino.execution.instances.ProcessInstance`: it pings the actor
(heartbeat and hang detection: an actor silent for ``workers.heartbeat_timeout`` is
killed), bounds a batch by ``workers.execution_timeout``, and when the actor dies (its
process, or its whole node) replaces it: Ray places the new actor on a live node,
after the same :class:`~sordino.execution.backoff.RestartBackoff` as a worker process.
A request cancelled while its batch runs is told to the actor (``ModelActor.cancel``),
so a Triton Python model's ``is_cancelled()`` turns true there as in a worker process.

``ray`` is imported only when an actor is made, so the module loads without it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from sordino.backends.registry import run_options
from sordino.clock import Clock
from sordino.config import ModelConfig, WorkersConfig
from sordino.config.executor import RayModelOptions
from sordino.errors import ModelLoadError, Unavailable
from sordino.events import EventSink
from sordino.execution.backoff import RestartBackoff, start_again
from sordino.execution.devices import Device
from sordino.execution.faults import FaultAction
from sordino.execution.instance_base import InstanceBase
from sordino.execution.ray_actor import actor_class, actor_options, import_ray
from sordino.execution.ray_pool import NodePools, PlacedBatch
from sordino.execution.staging import StagedBatch
from sordino.execution.worker import WorkerError, WorkerLost
from sordino.inference import ModelKey, ModelMetadata
from sordino.memory.refs import TensorRef
from sordino.records import WorkerStatistics
from sordino.telemetry.log_settings import process_log_settings

__all__ = ["RayInstance"]

log = logging.getLogger("sordino.workers")

LOST_BLOCK_HOLD_S = 2.0
"""A batch whose actor was lost keeps its node pool block this long before it is
reused: the killed actor's process may not have stopped writing into it yet."""

INLINE_BYTES = 64 * 1024
"""A batch up to this size travels inside the call (Ray inlines small arguments: about
1.2 ms a call here against 2.7 ms through ``ray.put``); a larger one goes into the
object store once and the actor reads it without a copy."""


def _lost_cause(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"actor lost: {type(exc).__name__}" + (f": {first[:200]}" if first else "")


class RayInstance(InstanceBase):
    """One actor slot on the Ray cluster: keeps one healthy actor, replacing it as needed."""

    isolation = "ray"

    def __init__(
        self,
        key: ModelKey,
        index: int,
        tier: str,
        device: Device,
        path: Path,
        config: ModelConfig,
        *,
        settings: WorkersConfig,
        clock: Clock,
        events: EventSink,
        notify: Callable[[], None],
        placement_group: Any = None,
        bundle: int = -1,
        pools: NodePools | None = None,
    ) -> None:
        """``pools``: the node pools batches are placed in (None: object store only)."""
        super().__init__(key, index, tier, device)
        self._spec = {
            "model": key.name,
            "version": key.version,
            "path": str(path),
            "index": index,
            "run": run_options(config),
            "providers": tuple(device.providers),
            "target": device.target,
            "intra_op_threads": device.intra_op_threads,
            "warmup_batches": settings.warmup_batches,
        }
        self._options = config.ray or RayModelOptions()
        self._settings = settings
        self._clock = clock
        self._events = events
        self._notify = notify
        self._placement_group = placement_group
        self._bundle = bundle
        self._pools = pools
        self._metadata: ModelMetadata | None = None
        self._releasing: set[asyncio.Task[None]] = set()
        self._telling: set[asyncio.Task[None]] = set()
        self._backoff = RestartBackoff(
            settings.restart_backoff,
            settings.restart_backoff_max,
            healthy_after_s=settings.restart_backoff_reset,
            healthy_batches=settings.restart_backoff_reset_batches,
        )
        self._actor: Any = None
        self._lost_now: asyncio.Event | None = None
        self._watch: asyncio.Task[None] | None = None
        self._closing = False
        self.node = ""
        """The Ray node id the current actor runs on (``ray list nodes`` shows it)."""
        self.node_address = ""
        self._pid_now: int | None = None
        self._checks_ready = False
        self.load_s = 0.0
        self._batch_ids = itertools.count(1)
        """Numbers the batches that may be told of cancellations (ModelActor.cancel)."""

    def _pid(self) -> int | None:
        return self._pid_now

    @property
    def checks_ready(self) -> bool:
        return self._checks_ready

    async def _check_ready(self) -> str | None:
        if self._actor is None:
            raise RuntimeError("no actor serves now")
        answer: str | None = await self._actor.readiness.remote()
        return answer

    @property
    def serving(self) -> bool:
        return self.state == "ready" and self._actor is not None

    def statistics(self) -> WorkerStatistics:
        return replace(super().statistics(), node=self.node)

    async def open(self) -> ModelMetadata:
        """Start the first actor; :class:`ModelLoadError` if it cannot load."""
        metadata = await self._start_actor()
        self._watch = asyncio.get_running_loop().create_task(
            self._supervise(), name=f"sordino-ray-watch-{self.subject}"
        )
        return metadata

    def _restart_failed(self, cause: str) -> None:
        self.last_cause = cause

    async def _start_actor(self) -> ModelMetadata:
        self.state = "starting"
        self._lost_now = asyncio.Event()
        actor = (
            actor_class()
            .options(**actor_options(self._options, self._placement_group, self._bundle))
            .remote()
        )
        self._actor = actor
        started = self._clock.now()
        try:
            result = await asyncio.wait_for(
                actor.load.remote({**self._spec, "log": process_log_settings().current()}),
                self._settings.start_timeout,
            )
        except TimeoutError:
            self._kill_actor(actor)
            raise ModelLoadError(
                f"{self.subject}: the Ray actor did not load within "
                f"{self._settings.start_timeout:g} s (workers.start_timeout); does the "
                f"cluster have the resources it asks for ({self._describe_resources()})?"
            ) from None
        except Exception as exc:
            self._kill_actor(actor)
            raise ModelLoadError(f"{self.subject}: the Ray actor failed to load: {exc}") from None
        metadata: ModelMetadata
        metadata, self.node, self.node_address, self._pid_now, self._checks_ready = result
        self._metadata = metadata
        if self._pools is not None:
            try:
                await self._pools.ensure(self.node, self.node_address, self._settings.start_timeout)
            except Exception as exc:
                self._kill_actor(actor)
                raise ModelLoadError(
                    f"{self.subject}: the memory pool of node {self.node_address} could not "
                    f"be made: {exc or 'timed out'} (executor.node_pool: false goes without)"
                ) from None
        self.load_s = self._clock.now() - started
        self._events.emit(
            "ray_actor_placed",
            self.subject,
            f"on node {self.node_address}",
            version=self.key.version,
            node=self.node,
            node_address=self.node_address,
            pid=self._pid_now,
            load_s=self.load_s,
        )
        self._backoff.started(self._clock.now())
        self.state = "ready"
        self._notify()
        return metadata

    def _describe_resources(self) -> str:
        options = self._options
        parts = [f"num_cpus {options.num_cpus:g}", f"num_gpus {options.num_gpus:g}"]
        parts += [f"{name} {amount:g}" for name, amount in options.resources.items()]
        return ", ".join(parts)

    async def run(self, batch: StagedBatch, fault: FaultAction | None) -> dict[str, TensorRef]:
        """Run ``batch`` on the actor: one object in the store there, the outputs back."""
        actor = self._actor
        if actor is None or not self.serving:
            raise WorkerLost("the actor is restarting")
        ray = import_ray()
        placed = await self._place(batch)  # before it counts: a refusal is not the actor's
        lost = False
        call: Any = None
        cancels = batch.context.cancels
        self.batches += 1
        timeout = self._settings.execution_timeout or None
        try:
            arrays = batch.arrays
            inputs = arrays
            if sum(int(array.nbytes) for array in arrays.values()) > INLINE_BYTES:
                inputs = ray.put(arrays)  # once per batch; the actor reads it zero-copy
            placement = placed.placement if placed is not None else None
            facts = batch.context.requests
            batch_id = next(self._batch_ids) if cancels is not None else 0
            call = actor.infer.remote(inputs, fault, placement, batch.request_rows, facts, batch_id)
            if cancels is not None:
                cancels.bind(functools.partial(self._tell_cancelled, actor, batch_id))
            kind, result = await asyncio.wait_for(call, timeout)
            call = None
        except TimeoutError:
            self.failures += 1
            lost = True
            cause = f"timeout: the batch ran over {timeout:g} s (workers.execution_timeout)"
            self._lose(actor, cause)
            raise WorkerLost(cause) from None
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the actor or its node died, or the object was lost
            self.failures += 1
            lost = True
            cause = _lost_cause(exc)
            self._lose(actor, cause)
            raise WorkerLost(cause) from None
        finally:
            if cancels is not None:
                cancels.bind(None)
            if placed is not None:
                self._give_back(placed, call if not lost else None, lost)
        if kind != "ok":
            self.failures += 1
            assert isinstance(result, str)
            raise WorkerError(kind, result)
        assert isinstance(result, dict)
        if actor is self._actor:
            self._backoff.served()
        return {name: TensorRef(np.asarray(array)) for name, array in result.items()}

    def _tell_cancelled(self, actor: Any, batch_id: int, index: int) -> None:
        """Tell ``actor`` that request ``index`` of batch ``batch_id`` was cancelled.

        Not awaited by the batch: the call's own failure (the actor gone) is read and
        dropped here; the batch's call reports the actor's loss."""
        told = actor.cancel.remote(batch_id, index)

        async def answered() -> None:
            try:
                await told
            except Exception as exc:
                log.debug("telling a Ray actor of a cancellation: %r", exc)

        task = asyncio.get_running_loop().create_task(answered())
        self._telling.add(task)
        task.add_done_callback(self._telling.discard)

    def _give_back(self, placed: PlacedBatch, running: Any, lost: bool) -> None:
        """Give the batch's pool block back once the actor no longer writes into it."""
        if lost:  # killed: its process may still be stopping
            asyncio.get_running_loop().call_later(LOST_BLOCK_HOLD_S, placed.release)
        elif running is not None:  # cancelled here while the actor still runs the batch
            timeout = self._settings.execution_timeout or None

            async def after() -> None:
                try:
                    await asyncio.wait_for(running, timeout)
                except BaseException as exc:  # the batch's end is all that is awaited here
                    log.debug("a cancelled batch ended: %r", exc)
                finally:
                    placed.release()

            task = asyncio.get_running_loop().create_task(after())
            self._releasing.add(task)
            task.add_done_callback(self._releasing.discard)
        else:
            placed.release()  # the outputs are back (copied out of the block)

    async def _place(self, batch: StagedBatch) -> PlacedBatch | None:
        """Charge and reserve ``batch`` in its node's pool (None without node pools)."""
        if self._pools is None:
            return None
        pool = self._pools.get(self.node)
        if pool is None or self._metadata is None:
            raise WorkerLost(f"node {self.node_address} has no memory pool yet")
        return await pool.place(
            batch.parts, batch.arrays, batch.context.owners, self._metadata, self._pools.memory
        )

    def _lose(self, actor: Any, cause: str) -> None:
        """Stop routing to ``actor``; the supervisor replaces it."""
        if actor is not self._actor:
            return
        self.last_cause = cause
        self._kill_actor(actor)
        if self.state == "ready":
            self.state = "restarting"
            self._notify()
        if self._lost_now is not None:
            self._lost_now.set()

    @staticmethod
    def _kill_actor(actor: Any) -> None:
        try:
            import_ray().kill(actor, no_restart=True)
        except Exception as exc:  # already gone with its node: nothing left to kill
            log.debug("killing a Ray actor: %s", exc)

    def kill(self, cause: str) -> None:
        """Kill the current actor (it is then replaced as after any failure)."""
        if self._actor is not None:
            self._lose(self._actor, cause)

    async def tell_log(self, settings: dict[str, Any]) -> None:
        """Have the actor log as the server now does (a replacement starts so anyway);
        an actor lost meanwhile, or one that does not answer in time, is let be."""
        actor = self._actor
        if actor is None:
            return
        try:
            await asyncio.wait_for(actor.log.remote(settings), self._settings.start_timeout)
        except Exception as exc:  # lost, or slow: its replacement starts with them
            log.warning("Ray actor %s did not take the new log settings: %r", self.subject, exc)

    async def start_profiling(self, prefix: str) -> None:
        raise Unavailable(
            f"{self.subject}: profiling is not supported with the ray executor "
            "(the trace would stay on the actor's node)"
        )

    async def stop_profiling(self) -> tuple[str, int]:
        raise WorkerLost("profiling was not started on this instance")

    async def aclose(self) -> None:
        self._closing = True
        self.state = "stopped"
        if self._watch is not None:
            self._watch.cancel()
        if self._actor is not None:
            self._kill_actor(self._actor)
            self._actor = None

    # -- supervision -----------------------------------------------------------------

    async def _supervise(self) -> None:
        while not self._closing:
            cause = await self._watch_actor()
            if self._closing:
                return
            failed_at = self._clock.now()
            node, address = self.node, self.node_address
            self.last_cause = cause
            if self.state == "ready":
                self.state = "restarting"
                self._notify()
            if self._actor is not None:
                self._kill_actor(self._actor)
            delay = self._backoff.next_delay(failed_at)
            log.warning("ray actor %s on node %s %s; replacing it", self.subject, address, cause)
            self._events.emit(
                "worker_failed",
                self.subject,
                cause,
                version=self.key.version,
                device=self.device.name,
                node=node,
                node_address=address,
                restart_in_s=delay,
                crash_loop=self._backoff.crash_loop,
            )
            await start_again(
                self._start_actor,
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
            self._events.emit(
                "worker_restarted",
                self.subject,
                cause,
                version=self.key.version,
                device=self.device.name,
                node=self.node,
                node_address=self.node_address,
                from_node=node,
                restarts=self.restarts,
                downtime_s=self._clock.now() - failed_at,
                load_s=self.load_s,
            )

    async def _watch_actor(self) -> str:
        """Return the cause once the actor is lost: a failed batch or a missed heartbeat."""
        timeout = self._settings.heartbeat_timeout
        interval = max(0.05, min(1.0, timeout / 4))
        lost = self._lost_now
        assert lost is not None
        while not lost.is_set():
            actor = self._actor
            try:
                await asyncio.wait_for(actor.ping.remote(), timeout)
            except TimeoutError:
                return f"hang: no heartbeat for {timeout:g} s (workers.heartbeat_timeout)"
            except Exception as exc:
                if lost.is_set():
                    break
                return _lost_cause(exc)
            try:
                await asyncio.wait_for(lost.wait(), interval)
            except TimeoutError:
                continue
        return self.last_cause or "actor lost"
