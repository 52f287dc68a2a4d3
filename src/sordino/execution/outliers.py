"""Outlier ejection: an instance that keeps failing batches leaves placement for a while.

Like Envoy's outlier detection, per instance rather than per device (a device's
trouble is its circuit breaker's, ``execution/breaker.py``). The chain
(``execution/chain.py``) retries a batch the model failed on one instance at once on
another serving instance of the same device, and tells this detector how that went:

- the other instance ran it: the failure was the first instance's own
  (:meth:`OutlierDetector.failed`);
- it failed there too: the batch's (a request the model rejects), and nobody's
  failure is counted — a bad request never ejects a healthy instance.

``consecutive_failures`` failures of its own in a row eject an instance for
``ejection_time``, twice as long for each further ejection without a success between
(up to ``max_ejection_time``). :func:`~sordino.execution.placement.choose` passes an
ejected instance over while another instance of its device serves; once the time is
up the instance gets batches again, and the first one it fails ejects it again (that
batch retried elsewhere, so probing costs no client an error). A success ends the
streak. The last serving instance of a device is never ejected: its failures are
counted, and the chain decides what to do with them (hold the batch for the
instance's replacement, or go down the device chain). A replaced instance (a new
worker process or actor, e.g. by the guardian's ``restart_worker``) starts afresh.

Every ejection is an ``instance_ejected`` event and every return an
``instance_returned`` event; :meth:`OutlierDetector.statistics` feeds
``sordino_instance_ejections_total`` and ``sordino_instance_ejected``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sordino.clock import Clock
from sordino.config.self_healing import SelfHealingConfig
from sordino.config.workers import OutlierEjectionConfig
from sordino.events import EventSink
from sordino.inference import ModelKey
from sordino.records import OutlierStatistics

__all__ = ["OutlierDetector", "Tracked", "guardian_replaces"]

log = logging.getLogger("sordino.execution")


def guardian_replaces(config: SelfHealingConfig, model: str) -> bool:
    """Whether the guardian replaces a failing instance of ``model`` (a ``restart_worker``
    trigger on it or on every model): only then may a batch wait for the replacement."""
    return config.enabled and any(
        action.name == "restart_worker"
        for trigger in config.triggers
        if trigger.model in (None, model)
        for action in trigger.parsed_actions()
    )


class Tracked(Protocol):
    """What the detector reads of an instance."""

    @property
    def key(self) -> ModelKey: ...

    @property
    def index(self) -> int: ...

    @property
    def subject(self) -> str: ...

    @property
    def serving(self) -> bool: ...

    @property
    def pid(self) -> int | None: ...


@dataclass(slots=True)
class _Record:
    pid: int | None
    """The worker (or actor) process the figures are about; a new one starts afresh."""
    consecutive: int = 0
    streak: int = 0
    """Ejections since the instance last ran a batch."""
    ejections: int = 0
    until: float | None = None
    last_cause: str = ""


class OutlierDetector:
    """Counts each instance's own failures and ejects those that keep failing."""

    def __init__(self, settings: OutlierEjectionConfig, *, clock: Clock, events: EventSink) -> None:
        self._settings = settings
        self._clock = clock
        self._events = events
        # By instance: (model, its generation, index); a reloaded version's two loads
        # have instances of the same index.
        self._records: dict[tuple[ModelKey, int, int], _Record] = {}
        self.ejections = 0

    def _record(self, instance: Tracked) -> _Record:
        key = _at(instance)
        record = self._records.get(key)
        pid = instance.pid
        if record is None or record.pid != pid:
            if record is not None and record.until is not None:
                self._returned(instance, record, "the instance was replaced")
            record = _Record(pid, ejections=record.ejections if record is not None else 0)
            self._records[key] = record
        return record

    def ejected(self, instance: Tracked) -> bool:
        """True while ``instance`` is ejected (False once replaced or its time is up)."""
        record = self._records.get(_at(instance))
        if record is None or record.until is None:
            return False
        record = self._record(instance)  # a replaced instance is no longer ejected
        if record.until is not None and self._clock.now() >= record.until:
            self._returned(instance, record, "ejection time over; offered batches again")
        return record.until is not None

    def suspect(self, instance: Tracked) -> bool:
        """True when ``instance`` failed ``consecutive_failures`` batches in a row."""
        record = self._records.get(_at(instance))
        return (
            record is not None
            and record.pid == instance.pid
            and record.consecutive >= self._settings.consecutive_failures
        )

    def succeeded(self, instance: Tracked) -> None:
        """``instance`` ran a batch: its failures in a row and its ejection streak end."""
        record = self._records.get(_at(instance))
        if record is not None and record.pid == instance.pid:
            record.consecutive = 0
            record.streak = 0

    def failed(self, instance: Tracked, cause: str, *, peers: Sequence[Tracked]) -> bool:
        """Count a batch ``instance`` failed on its own; True if that ejected it.

        ``peers`` are the instances of its device (``instance`` among them): it is
        ejected only while another of them serves and is not ejected itself.
        """
        record = self._record(instance)
        record.consecutive += 1
        record.last_cause = cause
        settings = self._settings
        if (
            not settings.enabled
            or record.until is not None
            or record.consecutive < settings.consecutive_failures
        ):
            return False
        others = [p for p in peers if p is not instance and p.serving and not self.ejected(p)]
        if not others:
            return False  # the last serving instance of its device stays
        seconds = min(
            settings.max_ejection_time, settings.ejection_time * 2 ** min(record.streak, 30)
        )
        record.until = self._clock.now() + seconds
        record.streak += 1
        record.ejections += 1
        self.ejections += 1
        log.warning(
            "instance %s ejected for %g s: %d batches failed in a row (last: %s)",
            instance.subject,
            seconds,
            record.consecutive,
            cause,
        )
        self._events.emit(
            "instance_ejected",
            instance.subject,
            cause,
            version=instance.key.version,
            consecutive_failures=record.consecutive,
            ejection_s=seconds,
            ejections=record.ejections,
        )
        return True

    def forget(self, key: ModelKey) -> None:
        """Drop the figures of ``key``'s instances (the model is unloaded)."""
        for at in [at for at in self._records if at[0] == key and at[1] == key.generation]:
            del self._records[at]

    def statistics(self) -> tuple[OutlierStatistics, ...]:
        """Each instance that failed a batch of its own or was ever ejected (of a version
        being reloaded, the instances of its first load, as the pool reports them)."""
        now = self._clock.now()
        shown: dict[tuple[ModelKey, int], tuple[int, _Record]] = {}
        for (key, generation, index), record in self._records.items():
            seen = shown.get((key, index))
            if seen is None or generation < seen[0]:
                shown[(key, index)] = (generation, record)
        return tuple(
            OutlierStatistics(
                model=key.name,
                version=key.version,
                index=index,
                consecutive_failures=record.consecutive,
                ejections=record.ejections,
                ejected_until=record.until
                if record.until is not None and record.until > now
                else None,
                last_cause=record.last_cause,
            )
            for (key, index), (_, record) in sorted(
                shown.items(), key=lambda item: (str(item[0][0]), item[0][1])
            )
        )

    def _returned(self, instance: Tracked, record: _Record, cause: str) -> None:
        record.until = None
        log.info("instance %s is back in placement: %s", instance.subject, cause)
        self._events.emit(
            "instance_returned", instance.subject, cause, version=instance.key.version
        )


def _at(instance: Tracked) -> tuple[ModelKey, int, int]:
    """Where an instance's record is kept: its model, the model's generation, its index."""
    return (instance.key, instance.key.generation, instance.index)
