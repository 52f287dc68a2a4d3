"""Hot reconfiguration: a new immutable snapshot, applied live, watched, rolled back if worse.

:class:`Reconfigurer` holds the live effective configuration as a snapshot — the
``RuntimeConfig`` and every served model's ``ModelConfig`` — and the history of
snapshots applied since start-up. A change (an overlay and ``--set`` assignments,
see :mod:`sordino.operations.changes`) is validated as start-up validates a file
(the same messages), refused naming every key that needs a restart, then applied:

- each model's scheduling (mode, batch policy, queue limits) is recomputed and handed
  to its running scheduler (:meth:`ModelScheduler.retune`): queued and running work
  stays where it is, so no request is dropped;
- the memory manager's defragmentation triggers take the new numbers;
- the runtime and the loader use the new snapshot for models loaded later.

Then the change is watched for ``reconfigure.verify_window``
(:mod:`sordino.operations.verify`); a worse one is rolled back to the previous
snapshot unless the call said not to. Every call leaves one ``admin_call`` event (a
manual intervention) with its outcome. Changes run one at a time: while one is being
verified, another is refused at once with :class:`~sordino.errors.Conflict` (409,
with Retry-After: the rest of its window) — rolling the first back would undo the
second too — and dry runs and reads still answer. The lock is held only to plan and
apply (a few seconds at most), never across a verify window.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import time
from dataclasses import dataclass, field
from typing import Any

from sordino.config import ModelConfig, RuntimeConfig, validate_config
from sordino.errors import ConfigError, Conflict, InvalidRequest, Unavailable, Unsupported
from sordino.inference import ModelKey
from sordino.operations.changes import (
    Change,
    apply_assignments,
    check_change,
    deep_merge,
    diff,
    strategies_as_list,
)
from sordino.operations.verify import Verdict, judge
from sordino.scheduling.settings import scheduling_for
from sordino.server.registry import LoadedModel
from sordino.server.runtime import Runtime
from sordino.telemetry.series import SecondRow

__all__ = ["ChangeRequest", "Reconfigurer", "Snapshot"]

log = logging.getLogger("sordino.reconfigure")

_HIDDEN = ("admin_token",)
_TICKER_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One immutable effective configuration: the runtime's and each model's."""

    config: RuntimeConfig
    models: dict[str, ModelConfig]

    def document(self) -> dict[str, Any]:
        """The JSON document of this snapshot (``models`` by name)."""
        document = self.config.model_dump(mode="json")
        document["models"] = {
            name: _model_document(config) for name, config in sorted(self.models.items())
        }
        return document


@dataclass(frozen=True, slots=True)
class ChangeRequest:
    """What a caller asks for: an overlay, assignments, and how to treat the result."""

    overlay: dict[str, Any] = field(default_factory=dict)
    assignments: dict[str, Any] = field(default_factory=dict)
    dry_run: bool = False
    rollback: bool | None = None
    verify_window_s: float | None = None
    source: str = "reconfigure"
    who: str = "unknown"


@dataclass(slots=True)
class HistoryEntry:
    """One call: when, who, what changed, and how it ended."""

    id: int
    at: float
    who: str
    source: str
    changes: list[Change]
    result: str
    detail: str = ""
    verdict: Verdict | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "at": self.at,
            "who": self.who,
            "source": self.source,
            "changes": [change.to_json() for change in self.changes],
            "result": self.result,
            "detail": self.detail,
            "verdict": self.verdict.to_json() if self.verdict else None,
        }


class Reconfigurer:
    """Applies configuration changes to one running :class:`Runtime`."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        models = _by_name(runtime.config.models)
        for model in _served(runtime):
            models.setdefault(model.key.name, model.source.config)
        self.live = Snapshot(runtime.config, models)
        self._history: list[HistoryEntry] = []
        self._next_id = 1
        self._lock = asyncio.Lock()
        self._verifying: HistoryEntry | None = None
        self._verify_ends = 0.0  # time.monotonic() when the change being verified is judged

    # -- reading ---------------------------------------------------------------------

    def show(self) -> dict[str, Any]:
        """The live effective configuration, secrets hidden."""
        self._learn_new_models()
        document = self.live.document()
        for key in _HIDDEN:
            if document["server"].get(key):
                document["server"][key] = "<hidden>"
        return document

    def history(self) -> list[dict[str, Any]]:
        """Every call kept, oldest first."""
        return [entry.to_json() for entry in self._history]

    # -- changing --------------------------------------------------------------------

    async def change(self, request: ChangeRequest) -> dict[str, Any]:
        """Validate, apply, verify and maybe roll back one change; return its history entry.

        Raises :class:`InvalidRequest` for a change that does not validate,
        :class:`Unsupported` for one that needs a restart (naming each key) and
        :class:`Conflict` while another change is being verified; none of them changes
        anything.
        """
        async with self._lock:
            self._learn_new_models()
            try:
                new, changes = self._plan(request)
            except (InvalidRequest, Unsupported) as exc:
                self._journal(request, "refused", str(exc))
                raise
            restart = [change for change in changes if not change.live]
            if request.dry_run:
                entry = self._record(request, changes, "dry_run", _restart_note(restart))
                return entry.to_json()
            if restart:
                message = _restart_message(restart)
                self._journal(request, "refused", message)
                raise Unsupported(message)
            if not changes:
                entry = self._record(request, changes, "unchanged", "nothing differs")
                return entry.to_json()
            if self._verifying is not None:
                left = max(0.0, self._verify_ends - time.monotonic())
                message = (
                    f"snapshot #{self._verifying.id} is being verified for {left:.0f} s more; "
                    "retry after it (or --dry-run meanwhile)"
                )
                self._journal(request, "refused", message)
                raise Conflict(message, retry_after_s=max(1.0, left))
            previous = self.live
            started = time.time()
            await self._apply(new)
            entry = self._record(request, changes, "verifying", "")
            settings = new.config.reconfigure
            window = (
                request.verify_window_s
                if request.verify_window_s is not None
                else settings.verify_window
            )
            rollback = settings.rollback if request.rollback is None else request.rollback
            if window > 0:
                self._verifying = entry
                self._verify_ends = time.monotonic() + window
            task = asyncio.ensure_future(self._verify(entry, previous, started, window, rollback))
        # The verification ends the call even when the caller stops waiting for it.
        return await asyncio.shield(task)

    def _plan(self, request: ChangeRequest) -> tuple[Snapshot, list[Change]]:
        check_change(request.overlay, request.assignments)
        current = self.live.document()
        document = deep_merge(current, request.overlay)
        document = apply_assignments(document, request.assignments)
        document = strategies_as_list(document)
        unknown = sorted(set(document["models"]) - set(current["models"]))
        if unknown:
            served = ", ".join(sorted(current["models"])) or "none"
            raise InvalidRequest(
                f"models.{unknown[0]}: no model {unknown[0]!r} is served (served: {served}); "
                "load it first"
            )
        snapshot = self._validate(document)
        return snapshot, diff(current, snapshot.document())

    def _validate(self, document: dict[str, Any]) -> Snapshot:
        """Validate ``document`` as start-up would; the same messages, models by name."""
        names = sorted(document["models"])
        candidate = dict(document)
        candidate["models"] = [{"name": name, **document["models"][name]} for name in names]
        try:
            config = validate_config(candidate)
        except ConfigError as exc:
            message = re.sub(
                r"\bmodels\.(\d+)\b", lambda m: f"models.{names[int(m.group(1))]}", str(exc)
            )
            raise InvalidRequest(message) from None
        models = _by_name(config.models)
        configured = set(_by_name(self.runtime.config.models))
        kept = tuple(model for model in config.models if model.name in configured)
        return Snapshot(config.model_copy(update={"models": kept}), models)

    async def _apply(self, snapshot: Snapshot) -> None:
        """Hand ``snapshot`` to the running parts; nothing queued or running is touched.

        A new ``memory.pool_size`` is applied first (the arena's segment replaced at a
        quiet moment, ``MemoryManager.resize``); when it cannot be, nothing changes.
        """
        runtime = self.runtime
        old = self.live.config
        await self._resize_pool(old, snapshot.config)
        runtime.use_config(snapshot.config)
        for model in _served(runtime):
            config = snapshot.models.get(model.key.name, model.source.config)
            model.reschedule(
                scheduling_for(
                    snapshot.config.scheduler,
                    config,
                    batched=model.scheduler.batched,
                    instances=model.instances,
                    node=snapshot.config.node_policies.get(model.key.name),
                )
            )
            model.source = dataclasses.replace(model.source, config=config)
        if snapshot.config.memory != old.memory:
            await runtime.memory.retune(snapshot.config.memory)
        self.live = snapshot

    async def _resize_pool(self, old: RuntimeConfig, new: RuntimeConfig) -> None:
        before, after = old.memory.pool_size, new.memory.pool_size
        if before == after:
            return
        if "auto" in (before, after):
            raise Unsupported(
                "memory.pool_size: switching to or from 'auto' needs a restart (a size "
                "such as 4GB changes live)"
            )
        default = new.workers.shared_memory
        capacity = new.memory.initial_pool(default)
        if capacity == old.memory.initial_pool(default):
            return
        memory = self.runtime.memory
        if memory.statistics().arena is None:
            # No worker process made the arena yet: it will be created at the new size.
            memory.owner.plan_capacity(capacity)
            return
        report = await memory.resize(capacity, reason="reconfigure")
        if report is None:
            raise Unavailable(
                f"memory.pool_size: the arena could not be resized to {capacity} bytes now "
                "(its live blocks do not fit, /dev/shm has no room, or no quiet moment "
                "came within 5 s); nothing was changed: retry, or restart with the new size"
            )

    async def _verify(
        self,
        entry: HistoryEntry,
        previous: Snapshot,
        started: float,
        window_s: float,
        rollback: bool,
    ) -> dict[str, Any]:
        try:
            return await self._judge(entry, previous, started, window_s, rollback)
        finally:
            if self._verifying is entry:
                self._verifying = None

    async def _judge(
        self,
        entry: HistoryEntry,
        previous: Snapshot,
        started: float,
        window_s: float,
        rollback: bool,
    ) -> dict[str, Any]:
        source = entry.source
        if window_s <= 0:
            entry.result, entry.detail = "applied", "no verify window"
            self._journal_entry(entry)
            return entry.to_json()
        begin = int(started)
        end = begin + max(1, round(window_s))
        series = self.runtime.telemetry.series
        # The ticker closes each second just after it ends; a stalled one is not waited
        # for past a few seconds (the judgement then uses the rows there are).
        deadline = time.monotonic() + (end - time.time()) + _TICKER_GRACE_S
        while (series.statistics().last_closed or 0) < end and time.monotonic() < deadline:
            await self.runtime.clock.sleep(0.25)
        rows = series.recent()
        before = _between(rows, begin - (end - begin), begin - 1)
        after = _between(rows, begin + 1, end)
        verdict = judge(before, after, self.live.config.reconfigure)
        entry.verdict = verdict
        if not verdict.worse:
            entry.result, entry.detail = "applied", verdict.reason
        elif rollback:
            async with self._lock:
                await self._apply(previous)
            entry.result, entry.detail = "rolled_back", verdict.reason
            log.warning("reconfigure #%d (%s) rolled back: %s", entry.id, source, verdict.reason)
        else:
            entry.result, entry.detail = "kept_worse", verdict.reason + " (kept: --no-rollback)"
        self._journal_entry(entry)
        return entry.to_json()

    # -- bookkeeping -----------------------------------------------------------------

    def _learn_new_models(self) -> None:
        """Models loaded since (model control) join the live snapshot with their config."""
        models = dict(self.live.models)
        added = False
        for model in _served(self.runtime):
            if model.key.name not in models:
                models[model.key.name] = model.source.config
                added = True
        if added:
            self.live = Snapshot(self.live.config, models)

    def _record(
        self, request: ChangeRequest, changes: list[Change], result: str, detail: str
    ) -> HistoryEntry:
        entry = HistoryEntry(
            self._next_id, time.time(), request.who, request.source, changes, result, detail
        )
        self._next_id += 1
        self._history.append(entry)
        del self._history[: -self.live.config.reconfigure.history]
        if result in ("dry_run", "unchanged"):
            self._journal_entry(entry)
        return entry

    def _journal_entry(self, entry: HistoryEntry) -> None:
        self.runtime.events.emit(
            "admin_call",
            "config",
            "reconfigure API",
            action="reconfigure",
            source=entry.source,
            who=entry.who,
            snapshot=entry.id,
            changes=[change.key for change in entry.changes],
            outcome=entry.result if not entry.detail else f"{entry.result}: {entry.detail}",
        )

    def _journal(self, request: ChangeRequest, result: str, detail: str) -> None:
        self.runtime.events.emit(
            "admin_call",
            "config",
            "reconfigure API",
            action="reconfigure",
            source=request.source,
            who=request.who,
            outcome=f"{result}: {detail}",
        )


def _served(runtime: Runtime) -> list[LoadedModel]:
    """The served models a snapshot describes (pipelines are configured on their own)."""
    pipelines = {pipeline.key for pipeline in runtime.pipelines}
    return [model for model in runtime.models() if model.key not in pipelines]


def _by_name(models: tuple[ModelConfig, ...]) -> dict[str, ModelConfig]:
    return {model.name: model for model in models if model.name is not None}


def _model_document(config: ModelConfig) -> dict[str, Any]:
    document = config.model_dump(mode="json")
    document.pop("name", None)
    return document


def _between(
    rows: dict[ModelKey, list[SecondRow]], first: int, last: int
) -> dict[ModelKey, list[SecondRow]]:
    return {key: [row for row in kept if first <= row.t <= last] for key, kept in rows.items()}


def _restart_note(restart: list[Change]) -> str:
    return _restart_message(restart) if restart else "every change can be applied live"


def _restart_message(restart: list[Change]) -> str:
    keys = "; ".join(f"{change.key} ({change.to_json()['why']})" for change in restart)
    return (
        f"these keys cannot change while the server runs: {keys}. Restart sordino with the "
        "new values, or leave them out of the change"
    )
