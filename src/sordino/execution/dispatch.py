"""The dispatcher: a staged batch's way across the instances and devices of the chain.

:meth:`Dispatcher.dispatch` is the retry loop behind ``ChainExecutor.run``: it runs a
batch where :func:`~sordino.execution.placement.choose` says, feeds the device
breakers and the outlier detector, retries past failing or lost instances and down the
device chain, and records device switches and retries. :meth:`Dispatcher.run_on` runs
a synthetic batch on one given instance (profiling, warm-up), past breakers and faults.
It owns no instance: the pool (``execution/pool.py``) starts and stops them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from sordino.clock import Clock, TimerHandle
from sordino.config import RuntimeConfig, WorkersConfig
from sordino.errors import InferenceFailed, ModelError
from sordino.events import EventSink
from sordino.execution.faults import FaultRegistry
from sordino.execution.outliers import OutlierDetector, guardian_replaces
from sordino.execution.placement import Instance, PlacedModel, TierSlot, choose
from sordino.execution.staging import StagedBatch, Staging
from sordino.execution.stats import SwitchRecorder
from sordino.execution.worker import WorkerError, WorkerLost
from sordino.inference import ModelKey, Tensor
from sordino.memory.refs import TensorRef

__all__ = ["Dispatcher"]


class Dispatcher:
    """Runs staged batches on a model's instances, down its device chain."""

    def __init__(
        self,
        config: RuntimeConfig,
        *,
        clock: Clock,
        events: EventSink,
        faults: FaultRegistry,
        outliers: OutlierDetector,
        staging: Staging,
    ) -> None:
        self._config = config
        self._settings = config.workers
        self._clock = clock
        self._events = events
        self.faults = faults
        self._outliers = outliers
        self._staging = staging
        self.switches = SwitchRecorder()
        """The device switches batches made (``ExecutionStatistics.switches``)."""
        self.retries = 0
        """How many times a batch was retried after a failure."""

    async def dispatch(self, model: PlacedModel, batch: StagedBatch) -> dict[str, TensorRef]:
        """Run ``batch`` where :func:`choose` says, down the chain and past failing instances.

        A batch whose instance is lost is retried once: on another serving instance,
        or, when none serves, on the lost one once it is restarted, if that happens
        within ``workers.start_timeout`` of the loss. A batch the model fails on one
        instance is retried once on another serving instance of the same device (see
        :meth:`_model_failed`); only a second failure there is the batch's own.
        """
        attempt = _Attempt()

        def give_up() -> bool:
            return attempt.give_up_at is not None and self._clock.now() >= attempt.give_up_at

        try:
            while True:
                choice = await choose(
                    model,
                    attempt.tried,
                    attempt.lost,
                    give_up=give_up,
                    failed=attempt.barred,
                    ejected=self._outliers.ejected,
                )
                if choice is None:
                    raise attempt.exhausted(model.key, self._settings, give_up())
                slot, instance = choice
                probe = slot.breaker.begin() if slot.breaker is not None else False
                fault = self.faults.pick(
                    model.key.name, instance.index, instance.device.name, batch.context.tenants
                )
                started = self._clock.now()
                failed_at = attempt.failed_at
                dispatch_s = started - failed_at if failed_at is not None else 0.0
                try:
                    outputs = await instance.run(batch, fault)
                except (WorkerError, WorkerLost) as exc:
                    self._failed(model, batch, slot, instance, started, probe, attempt, exc)
                    continue
                finally:
                    instance.busy = False
                    model.signal.fire()
                self._succeeded(model, slot, instance, started, probe, attempt, dispatch_s)
                return outputs
        finally:
            if attempt.timer is not None:
                attempt.timer.cancel()

    def _failed(
        self,
        model: PlacedModel,
        batch: StagedBatch,
        slot: TierSlot,
        instance: Instance,
        started: float,
        probe: bool,
        attempt: _Attempt,
        exc: WorkerError | WorkerLost,
    ) -> None:
        """The batch failed on ``instance`` (a try ``started`` then; ``probe``: it probed
        the breaker): feed the breaker, note whose fault it may be and until when to try
        again; raise when the batch must not run again."""
        now = self._clock.now()
        cause = exc.cause if isinstance(exc, WorkerLost) else str(exc)
        if batch.channel is not None and batch.channel.streamed:
            # Its clients have seen responses: running it again would repeat them.
            if slot.breaker is not None:
                slot.breaker.record(False, now - started, probe=probe, cause=cause)
            raise InferenceFailed(
                f"model {model.key} failed on a batch while it sent responses: {cause}"
            ) from None
        attempt.last_error = cause
        attempt.model_raised = isinstance(exc, WorkerError) and exc.kind == "error"
        attempt.flush()  # failed again: an earlier failure was not the instance's
        if slot.breaker is not None:
            record = functools.partial(
                slot.breaker.record, False, now - started, probe=probe, cause=cause
            )
            if probe or isinstance(exc, WorkerLost):
                record()
            else:
                attempt.deferred = record  # _model_failed decides
        if isinstance(exc, WorkerLost):
            if attempt.give_up_at is not None:
                raise InferenceFailed(
                    f"model {model.key}: the batch lost its worker twice ({cause})"
                ) from None
            attempt.lost.add(instance.index)
            attempt.give_up_at = now + self._settings.start_timeout
            attempt.timer = self._clock.call_at(attempt.give_up_at, model.signal.fire)
            self._retried(instance, cause)
        else:
            wait = self._model_failed(model, slot, instance, attempt, cause)
            if wait is not None and attempt.give_up_at is None:
                attempt.give_up_at = now + wait
                attempt.timer = self._clock.call_at(attempt.give_up_at, model.signal.fire)
        if attempt.failed_at is None:
            attempt.failed_at, attempt.failed_tier = now, slot.name

    def _succeeded(
        self,
        model: PlacedModel,
        slot: TierSlot,
        instance: Instance,
        started: float,
        probe: bool,
        attempt: _Attempt,
        dispatch_s: float,
    ) -> None:
        """The batch ran on ``instance``: feed the breaker and the outlier detector,
        blame an instance that failed it before, record a device switch."""
        now = self._clock.now()
        if slot.breaker is not None:
            slot.breaker.record(True, now - started, probe=probe)
        self._outliers.succeeded(instance)
        attempt.deferred = None  # an instance's own failure is not its device's
        if attempt.blamed is not None and attempt.blamed is not instance:
            # Another instance ran what the blamed one failed: its own failure.
            blamed, attempt.blamed = attempt.blamed, None
            peers = next((t.instances for t in model.tiers if blamed in t.instances), [])
            if self._outliers.failed(blamed, attempt.blamed_cause, peers=peers):
                model.signal.fire()
        failed_at, failed_tier = attempt.failed_at, attempt.failed_tier
        if failed_at is not None and slot.name != failed_tier:
            switch_s = now - failed_at
            self.switches.record(model.key.name, failed_tier, slot.name, switch_s, dispatch_s)
            self._events.emit(
                "device_switch",
                str(model.key),
                attempt.last_error,
                from_device=failed_tier,
                to_device=slot.name,
                switch_s=switch_s,
                dispatch_s=dispatch_s,
            )

    def _model_failed(
        self,
        model: PlacedModel,
        slot: TierSlot,
        instance: Instance,
        attempt: _Attempt,
        cause: str,
    ) -> float | None:
        """Decide where a batch the model failed on ``instance`` goes next.

        Raises when it goes nowhere; returns how long the batch may wait for
        ``instance``'s replacement, or None to go on at once:

        - a first failure, with another instance of the device serving: retried there
          (``instance`` is blamed only if that one runs it, see ``outliers.py``);
        - a failure on the second instance: the batch's own — the device is done with;
        - no other instance, and ``instance`` keeps failing (an outlier, counted here
          since nothing can clear it) and the guardian replaces failing instances
          (``restart_worker``): the batch waits up to
          ``workers.outlier_ejection.restart_wait`` for the replacement, once;
        - otherwise the next device of the chain, or the model's error.
        """
        attempt.barred_pids[instance.index] = instance.pid
        if attempt.blamed is None and not attempt.compared:
            peers = [
                i
                for i in slot.instances
                if i is not instance and i.serving and not attempt.barred(i)
            ]
            if peers:
                # The device's breaker hears of this failure only if the peer fails too.
                attempt.blamed, attempt.blamed_cause = instance, cause
                attempt.compared = True
                self._retried(instance, cause)
                return None
        attempt.flush()
        settings = self._settings.outlier_ejection
        if attempt.blamed is None and not attempt.compared:
            self._outliers.failed(instance, cause, peers=slot.instances)
            if (
                len(model.tiers) == 1
                and not attempt.held
                and settings.restart_wait > 0
                and instance.isolation != "thread"
                and self._outliers.suspect(instance)
                and guardian_replaces(self._config.guardian, model.key.name)
            ):
                attempt.held = True
                self._retried(instance, cause, waits_for_restart=True)
                return float(settings.restart_wait)
        attempt.blamed = None  # failed twice: the batch's, not an instance's
        attempt.tried.add(slot.name)
        if len(model.tiers) == 1:
            raise attempt.error(f"model {model.key} failed on a batch: {cause}")
        return None

    def _retried(self, instance: Instance, cause: str, *, waits_for_restart: bool = False) -> None:
        self.retries += 1
        self._events.emit(
            "batch_retried",
            instance.subject,
            cause,
            device=instance.device.name,
            **({"waits_for_restart": True} if waits_for_restart else {}),
        )

    async def run_on(
        self, model: PlacedModel, instance: Instance, batch: dict[str, Tensor]
    ) -> None:
        """Run ``batch`` on ``instance`` once idle; :class:`WorkerLost` if it stops serving."""
        while instance.busy and instance.serving:
            await model.signal.wait()
        if not instance.serving:
            raise WorkerLost(f"{instance.subject} is {instance.state}, not serving")
        instance.busy = True
        try:
            staged = await self._staging.stage(
                [batch], model.metadata, in_arena=model.isolation == "process"
            )
            try:
                await instance.run(staged, None)  # synthetic: the outputs are not needed
            finally:
                self._staging.release(staged)
        finally:
            instance.busy = False
            model.signal.fire()


@dataclass(slots=True)
class _Attempt:
    """Where one batch failed so far, and what that says about whose fault it was."""

    tried: set[str] = field(default_factory=set)
    """Tiers (devices) the batch failed on: the chain goes on without them."""
    lost: set[int] = field(default_factory=set)
    """Instances that lost the batch (crash, hang, timeout)."""
    barred_pids: dict[int, int | None] = field(default_factory=dict)
    """Instances the model failed the batch on, with the process that failed it."""
    blamed: Instance | None = None
    """The instance the batch failed on first, while another instance runs it."""
    blamed_cause: str = ""
    compared: bool = False
    """The batch was retried on a second instance of a device after a failure."""
    held: bool = False
    """The batch waited for a failing instance's replacement (once at most)."""
    last_error: str = ""
    model_raised: bool = False
    """The last failure was the model raising on these inputs."""

    deferred: Callable[[], None] | None = None
    """The failure to feed the device's breaker unless another instance runs the batch."""
    failed_at: float | None = None
    """When the batch first failed (a device switch is timed from then)."""
    failed_tier: str = ""
    """The tier (device) it first failed on."""
    give_up_at: float | None = None
    """When to stop waiting for an instance to run it again (a lost worker's restart,
    a failing instance's replacement); None while nothing is awaited."""
    timer: TimerHandle | None = None
    """Wakes the model's waiters at ``give_up_at``."""

    def flush(self) -> None:
        """Feed the deferred failure to the breaker now."""
        deferred, self.deferred = self.deferred, None
        if deferred is not None:
            deferred()

    def barred(self, instance: Instance) -> bool:
        """True if the model failed the batch on ``instance``'s current process."""
        return (
            instance.index in self.barred_pids and self.barred_pids[instance.index] == instance.pid
        )

    def error(self, message: str) -> InferenceFailed:
        return ModelError(message) if self.model_raised else InferenceFailed(message)

    def exhausted(self, key: ModelKey, settings: WorkersConfig, gave_up: bool) -> InferenceFailed:
        """The error of a batch with nowhere left to run."""
        if gave_up and self.held:
            wait = settings.outlier_ejection.restart_wait
            return self.error(
                f"model {key}: {self.last_error}; its only instance kept failing batches and "
                f"was not replaced within {wait:g} s (workers.outlier_ejection.restart_wait)"
            )
        if gave_up:
            return InferenceFailed(
                f"model {key}: {self.last_error}, and no instance served again "
                f"within {settings.start_timeout:g} s (workers.start_timeout)"
            )
        if not self.last_error:  # it never ran: no instance was left to run it
            return InferenceFailed(
                f"model {key} has no instance left to run the batch (they were stopped: "
                "the model is being unloaded or replaced); send it again"
            )
        return self.error(f"model {key} failed on every device it runs on: {self.last_error}")
