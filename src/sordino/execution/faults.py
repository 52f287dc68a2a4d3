"""Fault injection (chaos): faults chosen here, carried out for real inside the worker.

An operator (or a test) injects a fault on a target: ``device:NAME`` (every instance
on that device) or ``worker:MODEL`` / ``worker:MODEL/N`` (every instance of a model,
or its N-th). For each batch the executor asks :meth:`FaultRegistry.pick` whether a
fault hits it (``rate`` is the chance per batch); the chosen :class:`FaultAction`
travels with the batch and :func:`perform` carries it out where the model runs:

- ``error``: a real exception raised instead of running the model;
- ``latency``: a real sleep before the model runs;
- ``crash``: the worker process exits (code 70) in the middle of the batch;
- ``hang``: the worker process stops itself (SIGSTOP): no result, no heartbeat;
- ``oom``: a real allocation far beyond any machine's memory (MemoryError);
- ``temperature``: not a batch fault: while active, the device temperature sensor
  reads ``celsius`` (:meth:`FaultRegistry.temperature`), so the guardian's
  temperature triggers can be tested on machines without sensors.

A fault may be scoped to a tenant (``tenant``): it hits only batches holding a request
of that tenant (the batch's context names its tenants: ``BatchContext.tenants``). Its
``error`` is then a poisoned input (:class:`PoisonedInput`, a model error): the engine
re-runs the batch one request at a time, so only that tenant's requests fail. A scoped
``crash`` still takes the whole batch down with the worker, as a real crash would.

Faults aimed at one instance (``worker:MODEL/N``) of the kinds that make a process
sick without killing it (``error``, ``latency``, ``oom``) live in that process: when
the guardian replaces it (:meth:`FaultRegistry.clear_instance`), they go with it.

Every injection, clearing and expiry is an event. Before a fault is injected through
the executor, :func:`check_target` makes sure its target exists among the loaded
instances and devices, and that a ``crash`` or ``hang`` hits only worker processes.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, Protocol, get_args

from sordino.clock import Clock
from sordino.errors import InvalidRequest, NotFound
from sordino.events import EventSink
from sordino.execution.devices import Device
from sordino.inference import ModelKey

__all__ = [
    "CRASH_EXIT_CODE",
    "FaultAction",
    "FaultKind",
    "FaultRegistry",
    "FaultSpec",
    "InjectedFault",
    "PoisonedInput",
    "Target",
    "check_target",
    "parse_target",
    "perform",
]

FaultKind = Literal["error", "latency", "crash", "hang", "oom", "temperature"]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
CRASH_EXIT_CODE = 70


class InjectedFault(RuntimeError):
    """The exception an ``error`` fault raises inside the worker."""


class PoisonedInput(ValueError):
    """What a tenant-scoped ``error`` fault raises: as if the model refused an input."""


@dataclass(frozen=True, slots=True)
class Target:
    """What a fault hits: a device by name, or a model's instances (one, or all)."""

    kind: Literal["device", "worker"]
    name: str
    index: int | None = None

    def __str__(self) -> str:
        suffix = f"/{self.index}" if self.index is not None else ""
        return f"{self.kind}:{self.name}{suffix}"


def parse_target(text: str) -> Target:
    """Parse ``device:NAME``, ``worker:MODEL`` or ``worker:MODEL/N``."""
    kind, _, rest = text.partition(":")
    if kind not in ("device", "worker") or not rest:
        raise InvalidRequest(
            f"invalid fault target {text!r}: use device:NAME, worker:MODEL or worker:MODEL/N"
        )
    if kind == "device":
        return Target("device", rest)
    name, _, index = rest.partition("/")
    if index and not index.isdigit():
        raise InvalidRequest(f"invalid fault target {text!r}: the instance N must be a number")
    return Target("worker", name, int(index) if index else None)


class Placed(Protocol):
    """What :func:`check_target` reads of a model instance."""

    @property
    def key(self) -> ModelKey: ...

    @property
    def index(self) -> int: ...

    @property
    def device(self) -> Device: ...

    @property
    def isolation(self) -> str: ...


def check_target(
    text: str, kind: str, *, instances: Sequence[Placed], devices: Iterable[str] = ()
) -> Target:
    """Parse ``text`` and check that a ``kind`` fault can hit it; return the target.

    ``instances`` are the loaded model instances; ``devices`` names devices that exist
    even with no instance on them (the fallback chain's). Raises :class:`NotFound`
    for a device, model or instance that is not there (naming those that are), and
    :class:`InvalidRequest` for a bad target or a ``crash`` or ``hang`` fault that
    would hit a thread-isolated instance, which runs inside the server.
    """
    target = parse_target(text)
    if target.kind == "device":
        names = sorted({i.device.name for i in instances} | set(devices))
        if target.name not in names:
            raise NotFound(f"no device {target.name!r}; devices: {', '.join(names)}")
        chosen = [i for i in instances if i.device.name == target.name]
    else:
        chosen = [i for i in instances if i.key.name == target.name]
        if not chosen:
            names = sorted({i.key.name for i in instances})
            raise NotFound(f"no model {target.name!r} is loaded; models: {', '.join(names)}")
        if target.index is not None:
            chosen = [i for i in chosen if i.index == target.index]
            if not chosen:
                raise NotFound(f"model {target.name!r} has no instance {target.index}")
    if kind in ("crash", "hang") and any(i.isolation == "thread" for i in chosen):
        raise InvalidRequest(
            f"a {kind} fault needs process isolation; {target} includes thread-isolated "
            "instances, which run inside the server"
        )
    return target


@dataclass(frozen=True, slots=True)
class FaultAction:
    """One fault to carry out on one batch (picklable; sent to the worker)."""

    kind: FaultKind
    latency_s: float = 0.0
    fault_id: str = ""
    poison: bool = False
    """An ``error`` that stands for a poisoned input (a tenant-scoped fault)."""


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """An injected fault: what, where, how often, for how long."""

    id: str
    target: Target
    kind: FaultKind
    rate: float
    latency_s: float
    created: float
    expires: float | None
    celsius: float | None = None
    tenant: str | None = None

    def to_json(self, now: float) -> dict[str, Any]:
        data = asdict(self)
        data["target"] = str(self.target)
        data["remaining_s"] = None if self.expires is None else max(0.0, self.expires - now)
        del data["created"], data["expires"]
        return data


def perform(action: FaultAction, *, in_process: bool) -> None:
    """Carry out ``action`` here, where the model runs. Returns only for ``latency``."""
    if action.kind == "latency":
        time.sleep(action.latency_s)
        return
    if action.kind == "error" and action.poison:
        raise PoisonedInput(f"injected poisoned-input fault {action.fault_id}")
    if action.kind == "error":
        raise InjectedFault(f"injected error fault {action.fault_id}")
    if action.kind == "oom":
        import numpy as np

        # A real allocation request that no allocator can satisfy (1 PiB).
        np.empty(1 << 50, dtype=np.uint8)
        raise MemoryError("the allocation unexpectedly succeeded")
    if in_process:  # never take the server down with its own chaos
        raise InjectedFault(f"{action.kind} fault on a thread-isolated instance")
    if action.kind == "crash":
        os._exit(CRASH_EXIT_CODE)
    if action.kind == "hang":
        os.kill(os.getpid(), signal.SIGSTOP)
        return


class FaultRegistry:
    """The injected faults, their expiry on the clock, and the per-batch choice."""

    def __init__(self, clock: Clock, events: EventSink, *, seed: int | None = None) -> None:
        self._clock = clock
        self._events = events
        self._faults: dict[str, FaultSpec] = {}
        self._ids = itertools.count(1)
        self._random = random.Random(seed)
        self.applied = 0

    def inject(
        self,
        target: Target,
        kind: str,
        *,
        rate: float = 1.0,
        latency_s: float = 0.2,
        duration_s: float | None = None,
        celsius: float | None = None,
        cause: str = "chaos API",
        tenant: str | None = None,
    ) -> FaultSpec:
        """Add a fault; it hits each matching batch with probability ``rate``."""
        if kind not in FAULT_KINDS:
            raise InvalidRequest(f"unknown fault {kind!r}; use one of {', '.join(FAULT_KINDS)}")
        if not 0 < rate <= 1:
            raise InvalidRequest(f"fault rate {rate} must lie in (0, 1]")
        if latency_s < 0 or (duration_s is not None and duration_s <= 0):
            raise InvalidRequest("latency must be >= 0 and duration > 0")
        if kind == "temperature" and (celsius is None or not -50 <= celsius <= 200):
            raise InvalidRequest(
                "a temperature fault needs 'celsius', the reading to report (-50..200), e.g. 85"
            )
        if tenant is not None and kind not in ("error", "latency", "crash", "hang", "oom"):
            raise InvalidRequest(f"a {kind} fault cannot be scoped to a tenant")
        if kind == "temperature" and target.kind != "device":
            raise InvalidRequest("a temperature fault targets a device: device:NAME")
        now = self._clock.now()
        spec = FaultSpec(
            id=f"f{next(self._ids)}",
            target=target,
            kind=kind,  # type: ignore[arg-type]
            rate=rate,
            latency_s=latency_s if kind == "latency" else 0.0,
            created=now,
            expires=now + duration_s if duration_s else None,
            celsius=celsius if kind == "temperature" else None,
            tenant=tenant,
        )
        self._faults[spec.id] = spec
        self._events.emit(
            "fault_injected",
            str(target),
            cause,
            id=spec.id,
            fault=kind,
            rate=rate,
            latency_s=spec.latency_s,
            duration_s=duration_s,
            **({"celsius": celsius} if kind == "temperature" else {}),
            **({"tenant": tenant} if tenant is not None else {}),
        )
        return spec

    def clear(self, fault_id: str | None = None, *, cause: str = "chaos API") -> list[FaultSpec]:
        """Remove one fault (by id) or all of them; return what was removed."""
        if fault_id is not None and fault_id not in self._faults:
            raise InvalidRequest(
                f"no fault {fault_id!r}; active: {', '.join(self._faults) or 'none'}"
            )
        ids = [fault_id] if fault_id is not None else list(self._faults)
        removed = [self._faults.pop(i) for i in ids]
        for spec in removed:
            self._events.emit("fault_cleared", str(spec.target), cause, id=spec.id, fault=spec.kind)
        return removed

    def active(self) -> list[FaultSpec]:
        """The faults in force now (expired ones are dropped, with an event)."""
        now = self._clock.now()
        for spec in list(self._faults.values()):
            if spec.expires is not None and now >= spec.expires:
                del self._faults[spec.id]
                self._events.emit(
                    "fault_cleared",
                    str(spec.target),
                    "duration elapsed",
                    id=spec.id,
                    fault=spec.kind,
                )
        return list(self._faults.values())

    def temperature(self) -> float | None:
        """The injected temperature reading (the highest of the active faults), or None."""
        if not self._faults:
            return None
        values = [s.celsius for s in self.active() if s.celsius is not None]
        return max(values) if values else None

    def clear_instance(self, model: str, index: int, *, cause: str) -> list[FaultSpec]:
        """Clear the error, latency and oom faults aimed at instance ``index`` of ``model``.

        They stand for a sick process; the caller has just replaced it.
        """
        ids = [
            s.id
            for s in self._faults.values()
            if s.target == Target("worker", model, index) and s.kind in ("error", "latency", "oom")
        ]
        return [spec for fault_id in ids for spec in self.clear(fault_id, cause=cause)]

    def pick(
        self, model: str, index: int, device: str, tenants: frozenset[str] = frozenset()
    ) -> FaultAction | None:
        """Return the fault that hits a batch on instance ``index`` of ``model`` on ``device``.

        ``tenants`` are those whose requests the batch holds (its
        :class:`~sordino.execution.batch.BatchContext`'s); a fault scoped to a tenant
        hits only a batch holding that tenant's requests.
        """
        if not self._faults:
            return None
        for spec in self.active():
            if spec.kind == "temperature":
                continue
            if spec.tenant is not None and spec.tenant not in tenants:
                continue
            target = spec.target
            if target.kind == "device":
                if target.name != device:
                    continue
            elif target.name != model or target.index not in (None, index):
                continue
            if spec.rate >= 1 or self._random.random() < spec.rate:
                self.applied += 1
                return FaultAction(spec.kind, spec.latency_s, spec.id, spec.tenant is not None)
        return None
