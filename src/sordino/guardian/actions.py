"""The guardian's actions: small classes with ``apply``, ``verify`` and ``revert``.

An action acts on its target through :class:`Controls` (the executor, the admission
gate, the memory manager, the step degrader, the alert sender); it never reaches into
the request path. ``apply`` returns what it did, in words and as parameters;
``verify`` judges the watched metric after the action against the one before;
``revert`` undoes a configuration change (throttle, scale, shed, skip, degrade) and
does nothing for one-shot actions (restart, defrag, alert).

:func:`build_action` makes one from an :class:`~sordino.config.self_healing.ActionSpec`;
:func:`check_supported` refuses at start-up an action this build cannot carry out.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import psutil

from sordino.admission.gate import TrafficGate
from sordino.config.self_healing import ActionSpec, SelfHealingConfig
from sordino.errors import ConfigError
from sordino.execution.chain import ChainExecutor
from sordino.execution.placement import Instance
from sordino.inference import ModelKey

__all__ = [
    "Action",
    "Applied",
    "Controls",
    "Defragmenter",
    "ResultCache",
    "StepDegrader",
    "Verdict",
    "build_action",
    "check_supported",
]

log = logging.getLogger("sordino.guardian")

Verdict = Literal["cleared", "not cleared", "worse"]


@runtime_checkable
class Defragmenter(Protocol):
    """The memory manager's compaction (``Runtime.memory``)."""

    async def defragment(self, reason: str) -> Any:
        """Compact now; return a record with bytes_moved, fragmentation_before/after, pause_s."""
        ...


@runtime_checkable
class StepDegrader(Protocol):
    """Fewer steps for iterative models (``Runtime.step_degrader``); None restores them."""

    def set_step_factor(self, factor: float | None) -> None: ...


@runtime_checkable
class ResultCache(Protocol):
    """The transport's result cache (``Runtime.result_cache``)."""

    def enable(self, model: str | None, on: bool) -> None: ...


@dataclass(slots=True)
class Controls:
    """What actions act through; the runtime passes what this build has."""

    executor: ChainExecutor
    gate: TrafficGate
    config: SelfHealingConfig
    models: Callable[[], list[ModelKey]]
    worst_instance: Callable[[ModelKey], int | None]
    defragmenter: Defragmenter | None = None
    step_degrader: StepDegrader | None = None
    result_cache: ResultCache | None = None
    recover: Callable[[ModelKey, list[Instance]], Awaitable[None]] | None = None
    tasks: set[asyncio.Task[None]] = field(default_factory=set)

    def key(self, model: str | None) -> ModelKey | None:
        """The loaded version of ``model`` (None: the only loaded model, if one)."""
        if model is not None:
            return self.executor.find_model(model)
        keys = self.models()
        return keys[0] if len(keys) == 1 else None

    def in_background(self, work: Awaitable[None]) -> None:
        async def run() -> None:
            try:
                await work
            except Exception:
                log.exception("guardian background work failed")

        task = asyncio.get_running_loop().create_task(run())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


@dataclass(slots=True)
class Applied:
    """What an action did: a sentence fragment ("restarted instance 1") and parameters."""

    did: str
    parameters: dict[str, Any]
    changed: bool = True
    """False when the action found nothing to do (no instance, already at the bound)."""


class Action:
    """Base: one action on one target model (None: every model)."""

    reversible = False

    def __init__(self, spec: ActionSpec, model: str | None, controls: Controls) -> None:
        self.spec = spec
        self.model = model
        self.controls = controls
        self.worst_model: str | None = None
        """Set by the guardian for a trigger over every model: where the metric was worst
        (the model a restart, scale or device switch acts on)."""

    def target(self) -> ModelKey | None:
        """The model a per-model action acts on: its own, else the worst one."""
        return self.controls.key(self.model or self.worst_model)

    @property
    def conflict_key(self) -> tuple[str, str | None]:
        """Two actions with the same key would fight over one control."""
        return (self.spec.name, self.model)

    async def apply(self, reason: str) -> Applied:
        raise NotImplementedError

    def verify(
        self, before: float | None, after: float | None, holds_after: bool, op: str = ">"
    ) -> Verdict:
        """``cleared`` when the condition no longer holds; ``worse`` when the metric moved
        further past the threshold (up for ``>``, down for ``<``) by more than 10 %; else
        ``not cleared``."""
        if not holds_after:
            return "cleared"
        if before is not None and after is not None and _further(before, after, op):
            return "worse"
        return "not cleared"

    async def revert(self) -> str | None:
        """Undo the change; return what was undone in words (None: nothing to undo)."""
        return None


def _further(before: float, after: float, op: str) -> bool:
    if op in (">", ">="):
        return after > before + abs(before) * 0.1 + 1e-9
    return after < before - abs(before) * 0.1 - 1e-9


class RestartWorker(Action):
    async def apply(self, reason: str) -> Applied:
        key = self.target()
        if key is None:
            return Applied("found no model to restart", {}, changed=False)
        index = self.controls.worst_instance(key)
        if index is None:
            return Applied(f"found no restartable instance of {key.name}", {}, changed=False)
        ok = await self.controls.executor.restart_instance(key, index, cause=f"guardian: {reason}")
        if not ok:
            return Applied(
                f"could not restart instance {index} of {key.name} (thread-isolated)",
                {"instance": index},
                changed=False,
            )
        if self.controls.recover is not None:
            instance = self.controls.executor.instance(key, index)
            if instance is not None:
                self.controls.in_background(self.controls.recover(key, [instance]))
        return Applied(f"restarted instance {index}", {"model": key.name, "instance": index})


class TriggerDefrag(Action):
    async def apply(self, reason: str) -> Applied:
        memory = self.controls.defragmenter
        assert memory is not None  # check_supported refused the trigger otherwise
        record = await memory.defragment(reason=reason)
        names = ("bytes_moved", "fragmentation_before", "fragmentation_after", "pause_s")
        parameters = {n: getattr(record, n, None) for n in names}
        before, after = parameters["fragmentation_before"], parameters["fragmentation_after"]
        did = "defragmented the memory pool"
        if isinstance(before, int | float) and isinstance(after, int | float):
            did += f" (fragmentation {before:.0%} → {after:.0%}"
            moved = parameters["bytes_moved"]
            did += f", {moved / 2**20:.1f} MiB moved)" if isinstance(moved, int | float) else ")"
        return Applied(did, parameters)


class ThrottleRequests(Action):
    reversible = True

    def __init__(self, spec: ActionSpec, model: str | None, controls: Controls) -> None:
        super().__init__(spec, model, controls)
        self._before: float | None = None

    @property
    def conflict_key(self) -> tuple[str, str | None]:
        return ("throttle", self.model)

    async def apply(self, reason: str) -> Applied:
        gate = self.controls.gate
        share = float(self.spec.amount or 0.2)
        self._before = gate.throttling(self.model)
        gate.throttle(self.model, min(1.0, self._before + share))
        scope = self.model or "every model"
        return Applied(
            f"throttled the lowest priority of {scope} by {share:.0%}",
            {"model": self.model, "share": share},
        )

    async def revert(self) -> str | None:
        if self._before is None:
            return None
        self.controls.gate.throttle(self.model, self._before)
        self._before = None
        return f"lifted the {self.spec.amount or 0.2:.0%} throttle"


class ShedLowPriority(Action):
    reversible = True

    async def apply(self, reason: str) -> Applied:
        self.controls.gate.shed_low_priority(self.model, True)
        return Applied(f"shed the lowest priority of {self.model or 'every model'}", {})

    async def revert(self) -> str | None:
        self.controls.gate.shed_low_priority(self.model, False)
        return "stopped shedding the lowest priority"


class SkipNonCritical(Action):
    reversible = True

    async def apply(self, reason: str) -> Applied:
        self.controls.gate.skip_non_critical(self.model, True)
        tags = list(self.controls.config.non_critical_tags)
        return Applied(f"answered requests tagged {', '.join(tags)} with 503", {"tags": tags})

    async def revert(self) -> str | None:
        self.controls.gate.skip_non_critical(self.model, False)
        return "took non-critical requests again"


class ScaleWorkers(Action):
    reversible = True

    def __init__(self, spec: ActionSpec, model: str | None, controls: Controls) -> None:
        super().__init__(spec, model, controls)
        self._changed: tuple[ModelKey, int] | None = None

    @property
    def conflict_key(self) -> tuple[str, str | None]:
        return ("scale", self.model)

    async def apply(self, reason: str) -> Applied:
        key = self.target()
        if key is None:
            return Applied("found no model to scale", {}, changed=False)
        config = self.controls.config
        executor = self.controls.executor
        before = executor.instances(key)
        delta = int(self.spec.amount or 0)
        if delta > 0:
            room = _instances_memory_allows(executor, key)
            if room is not None and room < delta:
                delta = room
                if room == 0:
                    return Applied(
                        f"left {key.name} at {before} instances (not enough free memory "
                        "for another worker)",
                        {"model": key.name, "instances": before},
                        changed=False,
                    )
        changed = await executor.scale(
            key, delta, minimum=config.min_instances, maximum=config.max_instances
        )
        after = executor.instances(key)
        if after == before:
            bound = "max_instances" if (self.spec.amount or 0) > 0 else "min_instances"
            return Applied(
                f"left {key.name} at {before} instances ({bound})",
                {"model": key.name, "instances": before},
                changed=False,
            )
        self._changed = (key, after - before)
        if after > before and self.controls.recover is not None:
            self.controls.in_background(self.controls.recover(key, changed))
        return Applied(
            f"scaled {key.name} from {before} to {after} instances",
            {"model": key.name, "before": before, "after": after},
        )

    async def revert(self) -> str | None:
        if self._changed is None:
            return None
        key, delta = self._changed
        self._changed = None
        config = self.controls.config
        executor = self.controls.executor
        before = executor.instances(key)
        await executor.scale(
            key, -delta, minimum=config.min_instances, maximum=config.max_instances
        )
        return f"scaled {key.name} back from {before} to {executor.instances(key)} instances"


def _instances_memory_allows(executor: ChainExecutor, key: ModelKey) -> int | None:
    """How many more workers of ``key`` the machine's free memory holds (each as large as
    its largest worker now, with a quarter to spare); None when that cannot be told."""
    sizes = []
    for worker in executor.statistics().workers:
        if worker.model == key.name and worker.version == key.version and worker.pid:
            try:
                sizes.append(psutil.Process(worker.pid).memory_info().rss)
            except (psutil.Error, OSError):
                continue
    if not sizes:
        return None
    available = psutil.virtual_memory().available
    return max(0, int(available // (max(sizes) * 1.25)))


class DegradeSteps(Action):
    reversible = True

    async def apply(self, reason: str) -> Applied:
        degrader = self.controls.step_degrader
        assert degrader is not None  # check_supported refused the trigger otherwise
        factor = float(self.spec.amount or 0.5)
        degrader.set_step_factor(factor)
        return Applied(f"cut the steps of iterative models to {factor:.0%}", {"factor": factor})

    async def revert(self) -> str | None:
        degrader = self.controls.step_degrader
        assert degrader is not None
        degrader.set_step_factor(None)
        return "restored the full number of steps"


class CacheRecentResults(Action):
    reversible = True

    async def apply(self, reason: str) -> Applied:
        cache = self.controls.result_cache
        assert cache is not None  # check_supported refused the trigger otherwise
        cache.enable(self.model, True)
        scope = self.model or "every model"
        return Applied(f"served identical recent requests of {scope} from the result cache", {})

    async def revert(self) -> str | None:
        assert self.controls.result_cache is not None
        self.controls.result_cache.enable(self.model, False)
        return "stopped serving from the result cache"


class SwitchDevice(Action):
    reversible = True

    def __init__(self, spec: ActionSpec, model: str | None, controls: Controls) -> None:
        super().__init__(spec, model, controls)
        self._switched: tuple[ModelKey, str] | None = None

    async def revert(self) -> str | None:
        if self._switched is None:
            return None
        key, device = self._switched
        self._switched = None
        if not self.controls.executor.restore_device(key, device, cause="guardian: switch back"):
            return f"found device {device} already back for {key.name}"
        return f"switched {key.name} back to device {device}"

    async def apply(self, reason: str) -> Applied:
        key = self.target()
        if key is None:
            return Applied("found no model to switch", {}, changed=False)
        switched = self.controls.executor.switch_device(key, cause=f"guardian: {reason}")
        if switched is None:
            return Applied(f"found no other device serving {key.name}", {}, changed=False)
        self._switched = (key, switched[0])
        return Applied(
            f"switched {key.name} from device {switched[0]} to {switched[1]}",
            {"model": key.name, "from_device": switched[0], "to_device": switched[1]},
        )


class Alert(Action):
    async def apply(self, reason: str) -> Applied:
        # Every guardian record goes to the alert channels; this action only notifies.
        return Applied("alerted", {"channels": list(self.controls.config.alert_channels)})


_CLASSES: dict[str, type[Action]] = {
    "restart_worker": RestartWorker,
    "trigger_defrag": TriggerDefrag,
    "throttle_requests": ThrottleRequests,
    "shed_low_priority": ShedLowPriority,
    "skip_non_critical": SkipNonCritical,
    "scale_workers": ScaleWorkers,
    "degrade_steps": DegradeSteps,
    "cache_recent_results": CacheRecentResults,
    "switch_device": SwitchDevice,
    "alert": Alert,
}


def check_supported(spec: ActionSpec, controls: Controls) -> None:
    """Raise :class:`ConfigError` for an action this build (or server) cannot carry out."""
    if spec.name == "switch_device" and not controls.executor.has_device_chain:
        raise ConfigError(
            "self_healing: switch_device needs a device chain to switch along: add a "
            "fallback_chain strategy under scheduler.strategies"
        )
    if spec.name == "trigger_defrag" and controls.defragmenter is None:
        raise ConfigError(
            "self_healing: not supported in this build: trigger_defrag needs the memory manager"
        )
    if spec.name == "cache_recent_results" and controls.result_cache is None:
        raise ConfigError("self_healing: cache_recent_results needs the server's result cache")
    if spec.name == "degrade_steps" and controls.step_degrader is None:
        raise ConfigError(
            "self_healing: not supported in this build: degrade_steps needs the step degrader "
            "of iterative (diffusion) models"
        )


def build_action(spec: ActionSpec, model: str | None, controls: Controls) -> Action:
    """The action ``spec`` names, aimed at ``model``."""
    check_supported(spec, controls)
    return _CLASSES[spec.name](spec, model, controls)
