"""The executor's controls: what the guardian and the admin API do to running models.

:class:`ExecutorControls` restarts an instance, switches a model down its device chain and
back (through the device breakers), warms an instance up, injects chaos faults after
checking their target, and opens a profiling window. It acts on the instance pool
(``execution/pool.py``) and runs its synthetic batches through the dispatcher
(``execution/dispatch.py``); ``ChainExecutor`` exposes each control by the same name.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sordino.backends.base import dummy_inputs
from sordino.backends.registry import backend_kind
from sordino.clock import Clock
from sordino.errors import Unavailable, Unsupported
from sordino.execution.dispatch import Dispatcher
from sordino.execution.faults import FaultRegistry, FaultSpec, check_target
from sordino.execution.instances import ProcessInstance
from sordino.execution.placement import Instance, Placement
from sordino.execution.pool import InstancePool
from sordino.execution.profiling import Profiled, ProfileTraces, profile_instances
from sordino.execution.thread_instance import ThreadInstance
from sordino.execution.worker import WorkerError, WorkerLost
from sordino.inference import ModelKey, Tensor

__all__ = ["ExecutorControls"]


class ExecutorControls:
    """Restarts, device switches, warm-up, chaos faults and profiling windows."""

    def __init__(
        self,
        pool: InstancePool,
        *,
        placement: Placement,
        faults: FaultRegistry,
        dispatcher: Dispatcher,
        clock: Clock,
    ) -> None:
        self._pool = pool
        self._placement = placement
        self.faults = faults
        self._dispatcher = dispatcher
        self._clock = clock
        self._profiling: set[ModelKey] = set()
        """The models in a profiling window now (one window at a time per model)."""

    async def restart_instance(self, key: ModelKey, index: int, *, cause: str) -> bool:
        """Replace instance ``index`` of ``key`` with a fresh worker; False if it cannot.

        The instance's supervisor restarts it as after any failure; the error, latency
        and oom faults aimed at this one instance go with the replaced process.
        Thread-isolated instances run inside the server and cannot be restarted.
        """
        entry = self._pool.entry(key)
        instance = next((i for i in entry.instances() if i.index == index), None) if entry else None
        if not isinstance(instance, ProcessInstance) or instance.pid is None:
            return False
        self.faults.clear_instance(key.name, index, cause="worker process replaced: " + cause)
        instance.kill(cause)
        return True

    def switch_device(self, key: ModelKey, *, cause: str) -> tuple[str, str] | None:
        """Send ``key``'s traffic down its device chain: open the breaker of the device
        serving it now. Returns (from, to), or None when it has no device to switch to.

        The breaker's cooldown and half-open probes bring the device back, as after any
        failure (``scheduler.strategies`` ``fallback_chain``).
        """
        entry = self._pool.model(key)
        serving = [
            slot
            for slot in entry.tiers
            if any(i.serving for i in slot.instances)
            and (slot.breaker is None or slot.breaker.allows())
        ]
        if len(serving) < 2 or serving[0].breaker is None:
            return None
        serving[0].breaker.trip(cause)
        entry.signal.fire()
        return serving[0].name, serving[1].name

    def restore_device(self, key: ModelKey, device: str, *, cause: str) -> bool:
        """Close the breaker :meth:`switch_device` opened on ``device``; False if not open."""
        entry = self._pool.model(key)
        slot = next((t for t in entry.tiers if t.name == device), None)
        if slot is None or slot.breaker is None or slot.breaker.state == "closed":
            return False
        slot.breaker.reset(cause)
        entry.signal.fire()
        return True

    async def warm_up(self, key: ModelKey, instance: Instance, batches: int) -> int:
        """Run ``batches`` zero-filled one-row batches on ``instance``; return how many ran."""
        entry = self._pool.model(key)
        ran = 0
        for _ in range(batches):
            try:
                await self._dispatcher.run_on(entry, instance, dummy_inputs(entry.metadata, 1))
            except (WorkerError, WorkerLost):
                break
            ran += 1
        return ran

    def inject_fault(
        self,
        target: str,
        kind: str,
        *,
        rate: float = 1.0,
        latency_s: float = 0.2,
        duration_s: float | None = None,
        celsius: float | None = None,
        tenant: str | None = None,
    ) -> FaultSpec:
        """Inject a fault after checking that its target exists (see ``check_target``)."""
        instances = [i for model in self._pool.models.values() for i in model.instances()]
        parsed = check_target(target, kind, instances=instances, devices=self._placement.chain)
        return self.faults.inject(
            parsed,
            kind,
            rate=rate,
            latency_s=latency_s,
            duration_s=duration_s,
            celsius=celsius,
            tenant=tenant,
        )

    async def profile(
        self,
        model: ModelKey,
        *,
        seconds: float,
        trace_dir: Path,
        synthetic_batch: Callable[[], dict[str, Tensor]],
    ) -> ProfileTraces:
        """Profile every instance of ``model`` for ``seconds``; see ``execution/profiling``.

        Worker processes and thread instances alike; zero-filled ``synthetic_batch()``
        batches run on the profiling instances (past the breakers and faults) when no
        live batch ran. Raises :class:`Unsupported` for a model whose backend kind cannot
        profile, :class:`Unavailable` when no instance left a trace, or while ``model``
        is being profiled already (one window at a time per model).
        """
        entry = self._pool.model(model)
        kind = self._pool.sources[model.slot][1].backend
        if not backend_kind(kind, model=str(model)).profiling:
            raise Unsupported(
                f"model {model} runs on the {kind} backend, which has no operators to "
                "profile: `sordino profile` traces ONNX Runtime's operators"
            )
        if model in self._profiling:
            raise Unavailable(f"model {model} is being profiled already; retry when that ends")
        instances = entry.instances()

        async def run_synthetic(instance: Profiled) -> object:
            assert isinstance(instance, ProcessInstance | ThreadInstance)
            await self._dispatcher.run_on(entry, instance, synthetic_batch())
            return None

        self._profiling.add(model)
        try:
            return await profile_instances(
                str(model),
                instances,
                seconds=seconds,
                trace_dir=trace_dir,
                clock=self._clock,
                run_synthetic=run_synthetic,
            )
        finally:
            self._profiling.discard(model)
