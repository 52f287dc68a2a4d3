"""A model instance's Ray actor (:class:`ModelActor`), and how one is made.

:class:`ModelActor` runs on some node of a Ray cluster. It builds its backend with
:func:`sordino.backends.registry.create_backend` (ONNX Runtime), warms it up, and runs
batches: the batch's arrays arrive as one object in Ray's object store (one
``ray.put`` per batch on the server, read zero-copy in the actor; a batch of at most
:data:`~sordino.execution.ray_instance.INLINE_BYTES` travels inside the call instead,
which halves the hop) and the outputs come back the same way. Chaos faults run inside
the actor with :func:`sordino.execution.faults.perform` (a crash ends the actor
process, a hang stops it), as in a worker process. The server's side of an actor is
``ray_instance.py``.

A request's cancellation (its client went away while the batch runs) reaches the
actor as a :meth:`ModelActor.cancel` call, which runs on the actor's second thread
while ``infer`` runs on the first: the model's ``is_cancelled()`` turns true, as in a
worker process. A model's own readiness check (:meth:`ModelActor.readiness`) runs on a
third.

``ray`` is imported only when an actor is made, so the module loads without it.
"""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sordino.backends.base import (
    Backend,
    ModelRunOptions,
    ReadinessBackend,
    RequestBatchBackend,
    dummy_inputs,
    readiness_of,
)
from sordino.backends.registry import backend_kind, create_backend
from sordino.config.executor import RayModelOptions
from sordino.errors import Unavailable
from sordino.execution.faults import FaultAction, InjectedFault, perform
from sordino.execution.ray_pool import place_and_run
from sordino.inference import ModelMetadata, RequestFacts, Tensor
from sordino.telemetry.log_settings import configure_process_log, process_log_settings

__all__ = ["INSTALL_HINT", "ModelActor", "actor_class", "actor_options", "import_ray"]

INSTALL_HINT = "pip install 'sordino[ray]'"


def import_ray() -> Any:
    """The ``ray`` module; :class:`Unavailable` naming the extra to install without it."""
    try:
        import ray
    except ImportError as exc:
        raise Unavailable(
            f"executor.kind: ray needs the ray package, which is not installed ({exc}); "
            f"install it with: {INSTALL_HINT}"
        ) from None
    return ray


class _Cancelled:
    """The requests of the actor's batches whose clients went away (any thread).

    A :meth:`ModelActor.cancel` may run (on the actor's other thread) before the
    :meth:`ModelActor.infer` of its batch starts: batch ids only grow, so one for a
    batch not started yet is kept until it starts; one for a batch that ended is dropped.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[int, set[int]] = {}
        self._early: dict[int, set[int]] = {}
        self._last = 0

    def start(self, batch_id: int) -> Callable[[int], bool]:
        """Batch ``batch_id`` runs: its requests' ``is_cancelled()``."""
        with self._lock:
            self._last = max(self._last, batch_id)
            indices = self._early.pop(batch_id, set())
            self._running[batch_id] = indices
            if self._early:  # those of batches that never started here
                self._early = {b: i for b, i in self._early.items() if b > batch_id}

        def cancelled(index: int) -> bool:
            with self._lock:
                return index in indices

        return cancelled

    def cancel(self, batch_id: int, index: int) -> None:
        with self._lock:
            running = self._running.get(batch_id)
            if running is not None:
                running.add(index)
            elif batch_id > self._last:
                self._early.setdefault(batch_id, set()).add(index)

    def end(self, batch_id: int) -> None:
        with self._lock:
            self._running.pop(batch_id, None)


class ModelActor:
    """One model instance on a Ray node: its backend, its warm-up, its batches."""

    def __init__(self) -> None:
        self._backend: Backend | None = None
        self._cancelled = _Cancelled()

    def load(self, spec: Mapping[str, Any]) -> tuple[ModelMetadata, str, str, int, bool]:
        """Load and warm up the model; return its metadata, node id, node address, pid and
        whether the model checks its own readiness (:meth:`readiness`)."""
        import ray

        if spec.get("log"):  # log as the server does (Ray leaves the actor's log bare)
            configure_process_log(spec["log"])
        run: ModelRunOptions = spec["run"]
        backend = create_backend(
            run,
            name=spec["model"],
            version=spec["version"],
            providers=spec["providers"],
            intra_op_threads=spec["intra_op_threads"],
            index=spec["index"],
            own_process=True,  # an actor is a process of one model instance
        )
        backend.load(Path(spec["path"]), spec["target"])
        # A decoupled model is not warmed up (the executor then refuses it by name), nor
        # one whose kind says not to (a Triton Python model acts on what it gets).
        warm_up = backend_kind(run.backend, model=spec["model"]).warm_up
        warmups = int(spec["warmup_batches"]) if warm_up and not backend.metadata.decoupled else 0
        for _ in range(warmups):
            backend.infer(dummy_inputs(backend.metadata, 1))
        self._backend = backend
        context = ray.get_runtime_context()
        address = str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]
        checks = isinstance(backend, ReadinessBackend) and backend.checks_readiness
        return backend.metadata, context.get_node_id(), address, os.getpid(), checks

    def infer(
        self,
        arrays: Mapping[str, Tensor],
        fault: FaultAction | None,
        placement: Mapping[str, Any] | None = None,
        rows: Sequence[int] = (),
        facts: Sequence[RequestFacts] = (),
        batch_id: int = 0,
    ) -> tuple[str, dict[str, Tensor] | str]:
        """Run one batch: ``("ok", outputs)`` or ``(kind, message)`` when the model raised.

        With ``placement`` the batch runs in its block of the node pool (``ray_pool.py``).
        ``rows`` (each request's rows) and ``facts`` (each request's facts) go to a
        backend that runs a batch as its requests (a Triton Python model), as in a
        worker process; with a ``batch_id`` (above 0) its requests' ``is_cancelled()``
        turns true once :meth:`cancel` names them.
        """
        backend = self._backend
        assert backend is not None, "load first"
        run: Callable[[dict[str, Tensor]], dict[str, Tensor]] = backend.infer
        if (rows or facts) and isinstance(backend, RequestBatchBackend):
            cancelled = self._cancelled.start(batch_id) if batch_id > 0 else None
            run = functools.partial(_infer_requests, backend, rows, facts, cancelled)
        try:
            if fault is not None:
                perform(fault, in_process=False)
            if placement is not None:
                return "ok", place_and_run(placement, arrays, run)
            return "ok", run(dict(arrays))
        except MemoryError as exc:
            return "oom", f"MemoryError: {exc}"
        except InjectedFault as exc:
            return "fault", f"{type(exc).__name__}: {exc}"
        except Exception as exc:
            return "error", f"{type(exc).__name__}: {exc}"
        finally:
            if batch_id > 0:
                self._cancelled.end(batch_id)

    def cancel(self, batch_id: int, index: int) -> None:
        """Request ``index`` of batch ``batch_id`` was cancelled: its ``is_cancelled()``
        turns true (runs on the actor's second thread while the batch runs)."""
        self._cancelled.cancel(batch_id, index)

    def readiness(self) -> str | None:
        """The model's own readiness check (Triton's ``is_ready()``): None when ready, else
        why not. Runs on a thread of its own, beside a batch and the heartbeat."""
        backend = self._backend
        assert isinstance(backend, ReadinessBackend), "load a model that checks readiness"
        return readiness_of(backend)

    def ping(self) -> int:
        """The heartbeat: answered between and during batches (the actor has three threads)."""
        return os.getpid()

    def log(self, settings: Mapping[str, Any]) -> dict[str, Any]:
        """Log as the server now does (the logging extension changed it), as a worker
        process takes ``LogChange``; return the settings the actor logs by now."""
        configure_process_log(settings)
        return process_log_settings().current()


def _infer_requests(
    backend: RequestBatchBackend,
    rows: Sequence[int],
    facts: Sequence[RequestFacts],
    cancelled: Callable[[int], bool] | None,
    batch: dict[str, Tensor],
) -> dict[str, Tensor]:
    return backend.infer_requests(batch, rows, facts, cancelled)


_remote: Any = None


def actor_class() -> Any:
    global _remote
    if _remote is None:
        ray = import_ray()
        # Three threads: the heartbeat and a request's cancellation are answered while a
        # batch runs (the executor sends one batch at a time to an instance), and so is
        # a readiness check, which may take the model its while (one at a time).
        _remote = ray.remote(max_concurrency=3, max_restarts=0)(ModelActor)
    return _remote


def actor_options(options: RayModelOptions, placement_group: Any, bundle: int) -> dict[str, Any]:
    """The ``.options(...)`` of one actor: resources and where Ray may place it."""
    chosen: dict[str, Any] = {
        "num_cpus": options.num_cpus,
        "num_gpus": options.num_gpus,
        "resources": dict(options.resources),
    }
    if placement_group is not None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        chosen["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
            placement_group, placement_group_bundle_index=bundle
        )
    elif options.placement == "spread":
        chosen["scheduling_strategy"] = "SPREAD"
    return chosen
