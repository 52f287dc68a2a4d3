"""Model control: load, reload and unload models while the server runs (Triton's modes).

``none``: the models loaded at start-up are served until shutdown; load and unload
are refused. ``explicit``: the load and unload endpoints (HTTP, gRPC, ``sordino
models``) change what is served. ``poll``: the model repository is rescanned every
``server.repository_poll_secs`` and what is served follows it; load and unload are
refused. As on Triton, ``none`` and ``poll`` start with every configured model loaded,
``explicit`` with those ``--load-model`` names (``sordino start``).

Loading a model (re)reads its repository folder (or its start-up configuration) and
brings the served versions in line with it: new versions are loaded first, versions
whose file changed are reloaded, and versions no longer selected are unloaded last,
with a drain, so requests already queued on them still finish and new requests go to
the versions that stay. Control operations run one at a time. A repository's Triton
ensembles are loaded and unloaded too, with the models they run
(:mod:`sordino.server.ensemble_control`).

A name given to load or unload must be a model name (``MODEL_NAME_PATTERN``); it is
looked up among the repository's folders and the start-up configuration, never used as
a path, and a repository model loads only files inside the repository (see
:mod:`sordino.models.repository`). Who may call these operations is the transports'
business (:class:`~sordino.control.admin.AdminAccess`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from sordino.config import ModelConfig
from sordino.config.pipelines import PipelineConfig
from sordino.errors import ConfigError, InvalidRequest, NotFound, SordinoError, Unsupported
from sordino.models.ensembles import ensemble_pipeline
from sordino.models.repository import (
    ModelSource,
    is_model_name,
    load_repository_model,
    repository_names,
    sources_for,
)
from sordino.server.ensemble_control import EnsembleSet
from sordino.server.runtime import Runtime

__all__ = ["IndexEntry", "ModelControl", "ModelControlStatistics", "load_parameters"]

log = logging.getLogger("sordino.control")

_Stamp = tuple[str, int, int, ModelConfig]


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One row of the repository index: a model version and its state.

    ``state`` is READY, LOADING, UNLOADING or UNAVAILABLE (Triton's names), and
    ``reason`` says why one is UNAVAILABLE; a model never loaded has neither a version
    nor a state, as on Triton.
    """

    name: str
    version: str
    state: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ModelControlStatistics:
    """Counters of the control operations since start-up."""

    mode: str
    loads: int
    reloads: int
    unloads: int
    failures: int
    polls: int


class ModelControl:
    """Loads and unloads the models of one runtime on request or by polling."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        server = runtime.config.server
        self.mode = server.model_control_mode
        self.repository: Path | None = runtime.config.model_repository
        self.poll_s = server.repository_poll_secs
        self._configs: dict[str, ModelConfig] = {}
        self._stamps: dict[tuple[str, str], _Stamp | None] = {}
        self.ensembles = EnsembleSet(runtime, self.repository)
        self._transient: dict[tuple[str, str], str] = {}
        self._failed: dict[str, str] = {}
        self._last_versions: dict[str, list[str]] = {}
        self._asked: set[str] = set()  # models loaded by name, not only as an ensemble's
        self._overrides: dict[str, dict[str, Any]] = {}  # a load's config, by model
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._loads = self._reloads = self._unloads = self._failures = self._polls = 0
        self._adopt()

    # -- lifecycle -------------------------------------------------------------------

    def _adopt(self) -> None:
        """Take in what the runtime serves that model control has not loaded itself (the
        start-up models, ensembles and their configurations): a load of one of them,
        unchanged, then does nothing, and one unloaded can be loaded again."""
        for model in self.runtime.models():
            key = (model.key.name, model.key.version)
            if model not in self.runtime.pipelines and key not in self._stamps:
                self._configs.setdefault(model.key.name, model.source.config)
                self._stamps[key] = _stamp(model.source)
        self.ensembles.adopt()
        steps = {n.model for c in self.ensembles.wanted.values() for n in c.nodes}
        self._asked |= {m.key.name for m in self.runtime.models()} - steps
        self._remember()

    def start(self) -> None:
        """Take in the start-up models (the runtime has started); start polling the
        repository (``poll`` mode only)."""
        self._adopt()
        if self.mode == "poll" and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._poll_loop(), name="sordino-repository-poll"
            )

    async def close(self) -> None:
        """Stop polling; an operation in progress finishes first."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- the operations --------------------------------------------------------------

    def index(self, *, ready_only: bool = False) -> list[IndexEntry]:
        """Every model the server knows: loaded versions, and models it could load."""
        names = set(self._configs) | {m.key.name for m in self.runtime.models()}
        names |= set(self._repository_names())
        entries: list[IndexEntry] = []
        for name in sorted(names):
            versions = self.runtime.versions(name)
            for version in versions:
                state = self._transient.get((name, version), "READY")
                entries.append(IndexEntry(name, version, state))
            for (model, version), state in sorted(self._transient.items()):
                if model == name and version not in versions:
                    entries.append(IndexEntry(name, version, state))
            if any(entry.name == name for entry in entries):
                continue
            reason = self._failed.get(name) or self.ensembles.failed.get(name)
            if reason is not None:
                entries.append(IndexEntry(name, "", "UNAVAILABLE", reason))
            elif name in self._last_versions:  # as Triton: the versions it had, unloaded
                entries += [
                    IndexEntry(name, v, "UNAVAILABLE", "unloaded")
                    for v in self._last_versions[name]
                ]
            else:
                entries.append(IndexEntry(name, "", ""))  # never loaded: a name alone
        if ready_only:
            return [entry for entry in entries if entry.state == "READY"]
        return entries

    async def load(self, name: str, config: str | None = None) -> None:
        """Load or reload ``name`` from the repository (``explicit`` mode only); an
        ensemble brings the models it runs. ``config``: a Triton configuration (JSON
        text) used instead of the folder's, as on Triton, from now on until the model
        is unloaded (a later load without one keeps it)."""
        self._require_explicit("load")
        _check_name(name)
        self._refuse_pipeline(name, "load")
        given = None if config is None else self._override(name, config)
        async with self._lock, self._journaled("load", name):
            before = self._overrides.get(name)
            if given is not None:
                self._overrides[name] = given
            try:
                await self._load(name)
            except BaseException:
                if given is not None:  # a load that failed leaves the config it had
                    self._overrides.pop(name, None)
                    if before is not None:
                        self._overrides[name] = before
                raise

    async def _load(self, name: str) -> None:
        if self.ensembles.owns(name):
            await self._load_ensemble(name, ())
        elif await self._apply(name, self._resolve(name)):
            self.ensembles.rebuild_users_of(name)
        self._asked.add(name)
        await self.ensembles.settle()
        failed = self.ensembles.failed.get(name)
        if failed is not None:
            self.ensembles.wanted.pop(name, None)
            self._failures += 1
            raise ConfigError(failed)

    async def unload(self, name: str, *, unload_dependents: bool = False) -> None:
        """Unload every version of ``name`` after its queued requests finish; the
        ensembles that run it drain first. ``unload_dependents``: an ensemble's models
        are unloaded too (but those loaded by name, or run by another ensemble asked
        for), as on Triton."""
        self._require_explicit("unload")
        _check_name(name)
        self._refuse_pipeline(name, "unload")
        async with self._lock, self._journaled("unload", name):
            known = name in self._configs or name in self._repository_names()
            if not self.runtime.versions(name) and not known:
                raise NotFound(f"unknown model {name!r}; nothing to unload")
            await self._unload(name, unload_dependents)
            self._asked.discard(name)
            self._overrides.pop(name, None)
            await self.ensembles.settle()

    def _override(self, name: str, config: str) -> dict[str, Any]:
        """A load's ``config``, read (InvalidRequest saying what is wrong with it)."""
        from sordino.backends.pbtxt import parse_triton_json

        if self.repository is None or name not in self._repository_names():
            raise Unsupported(
                f"model {name!r} is not a model of the repository, so a load's config cannot "
                "replace its configuration (not supported): change its entry in sordino's "
                "configuration instead, or load it without config"
            )
        try:
            return parse_triton_json(config, source="the load request's config")
        except ConfigError as exc:
            raise InvalidRequest(str(exc)) from None

    def _refuse_pipeline(self, name: str, action: str) -> None:
        """Refuse to load or unload a pipeline of the ``pipelines`` section."""
        if self.ensembles.owns(name):
            return
        if any(pipeline.key.name == name for pipeline in self.runtime.pipelines):
            raise Unsupported(
                f"{name!r} is a pipeline of the configuration's pipelines section: it is "
                f"served from start-up on and cannot be {action}ed while serving (not "
                "supported); restart the server to change it (a Triton ensemble in the "
                "model repository can be)"
            )

    async def _load_ensemble(self, name: str, within: tuple[str, ...]) -> None:
        """Load the models the ensemble ``name`` runs, then ask for it."""
        if name in within:
            raise ConfigError(
                f"ensembles run each other in a cycle: {' -> '.join((*within, name))}; an "
                "ensemble may run another only if that one does not run it back"
            )
        assert self.repository is not None
        try:
            config = ensemble_pipeline(self.repository / name, self._overrides.get(name))
        except SordinoError as exc:  # one served stays as it is, as on Triton
            self._failures += 1
            self.ensembles.failed[name] = str(exc)
            raise
        self.ensembles.failed.pop(name, None)
        served = {p.key.name for p in self.runtime.pipelines}
        for node in config.nodes:
            if self.ensembles.owns(node.model):
                await self._load_ensemble(node.model, (*within, name))
            elif node.model not in served and await self._apply(
                node.model, self._resolve(node.model)
            ):
                self.ensembles.rebuild_users_of(node.model)
        if not self.runtime.versions(name):
            self._loads += 1
        elif self.ensembles.wanted.get(name) != config:
            self._reloads += 1
        self.ensembles.wanted[name] = config

    async def _unload(self, name: str, dependents: bool) -> None:
        config: PipelineConfig | None = self.ensembles.wanted.pop(name, None)
        if config is None and not self.ensembles.owns(name):
            await self.ensembles.settle(leaving=[name])  # its ensembles drain first
            await self._apply(name, [])
            return
        if self.runtime.versions(name):
            self._unloads += 1
        await self.ensembles.settle()
        self.ensembles.failed.pop(name, None)
        # As on Triton: a model loaded by name stays, and one another ensemble runs.
        for model in {n.model for n in config.nodes} if config and dependents else ():
            if model not in self._asked and not self.ensembles.users_of([model]):
                await self._unload(model, dependents)

    @contextlib.asynccontextmanager
    async def _journaled(self, action: str, name: str) -> AsyncIterator[None]:
        """Leave an ``admin_call`` event (a manual intervention) with its outcome."""
        try:
            yield
        except Exception as exc:
            self._remember()
            self.runtime.events.emit(
                "admin_call",
                f"model:{name}",
                "model control API",
                action=action,
                outcome=f"failed: {exc}",
            )
            raise
        self._remember()
        self.runtime.events.emit(
            "admin_call", f"model:{name}", "model control API", action=action, outcome="ok"
        )

    def _remember(self) -> None:
        """Note the versions each model serves now (the index shows them unloaded)."""
        for name in {m.key.name for m in self.runtime.models()}:
            self._last_versions[name] = self.runtime.versions(name)

    async def poll_once(self) -> None:
        """Rescan the repository once and follow it: load, reload and unload models."""
        if self.repository is None:
            return
        async with self._lock:
            self._polls += 1
            present = self._repository_names()
            ensembles: dict[str, PipelineConfig] = {}
            for name in present:
                try:
                    if self.ensembles.owns(name):  # after the models it runs
                        ensembles[name] = ensemble_pipeline(self.repository / name)
                    elif await self._apply(name, load_repository_model(self.repository, name)):
                        self.ensembles.rebuild_users_of(name)
                except SordinoError as exc:  # a broken config.pbtxt among them
                    log.error("repository poll: model %r: %s", name, exc)
                    if name in self.ensembles.wanted:  # an unreadable one stays as it was
                        ensembles[name] = self.ensembles.wanted[name]
            for name in sorted(self._repository_loaded() - set(present)):
                await self.ensembles.settle(leaving=[name])
                await self._apply(name, [])
            self.ensembles.wanted = ensembles
            await self.ensembles.settle()
            self._remember()

    def statistics(self) -> ModelControlStatistics:
        """Return the counters of control operations."""
        return ModelControlStatistics(
            self.mode, self._loads, self._reloads, self._unloads, self._failures, self._polls
        )

    # -- internals -------------------------------------------------------------------

    def _require_explicit(self, action: str) -> None:
        if self.mode == "explicit":
            return
        if self.mode == "poll":
            raise Unsupported(
                f"cannot {action} models explicitly while the repository is polled "
                "(model_control_mode poll): change the repository folder instead, or start "
                "with --model-control-mode explicit"
            )
        raise Unsupported(
            f"cannot {action} models: model control is off (model_control_mode none); "
            "start sordino with --model-control-mode explicit to load and unload at run time"
        )

    def _repository_names(self) -> list[str]:
        return [] if self.repository is None else repository_names(self.repository)

    def _repository_loaded(self) -> set[str]:
        root = self.repository
        if root is None:
            return set()
        return {m.key.name for m in self.runtime.models() if m.source.path.is_relative_to(root)}

    def _resolve(self, name: str) -> list[ModelSource]:
        if self.repository is not None and name in self._repository_names():
            return load_repository_model(self.repository, name, self._overrides.get(name))
        config = self._configs.get(name)
        if config is not None:
            return sources_for(config)
        where = f"the model repository {self.repository}" if self.repository else "no repository"
        known = ", ".join(sorted(set(self._configs) | set(self._repository_names()))) or "none"
        raise NotFound(f"no model {name!r} to load in {where}; known models: {known}")

    async def _apply(self, name: str, sources: list[ModelSource]) -> bool:
        """Make the served versions of ``name`` exactly ``sources``: add, reload, then
        drain; return whether anything changed."""
        runtime = self.runtime
        wanted = {source.version: source for source in sources}
        loaded = set(runtime.versions(name))
        changed = bool(loaded - set(wanted))
        try:
            for version, source in sorted(wanted.items()):
                stamp = _stamp(source)
                if version in loaded:
                    if self._stamps.get((name, version)) == stamp:
                        continue
                    await self._step(
                        name, version, "UNLOADING", partial(runtime.unload, name, version)
                    )
                    self._reloads += 1
                else:
                    self._loads += 1
                changed = True
                await self._step(name, version, "LOADING", partial(runtime.load, source))
                self._stamps[(name, version)] = stamp
                self._configs[name] = source.config
            stale = sorted(loaded - set(wanted))
            self._unloads += len(stale)
            await asyncio.gather(
                *(self._step(name, v, "UNLOADING", partial(runtime.unload, name, v)) for v in stale)
            )
        except SordinoError as exc:
            self._failures += 1
            self._failed[name] = str(exc)
            raise
        self._failed.pop(name, None)
        for version in sorted(loaded - set(wanted)):
            self._stamps.pop((name, version), None)
        return changed

    async def _step(
        self, name: str, version: str, state: str, operation: Callable[[], Awaitable[object]]
    ) -> None:
        self._transient[(name, version)] = state
        try:
            await operation()
        finally:
            self._transient.pop((name, version), None)

    async def _poll_loop(self) -> None:
        while True:
            await self.runtime.clock.sleep(self.poll_s)
            try:
                await self.poll_once()
            except Exception:  # a broken repository must not stop polling
                log.exception("repository poll failed")


def load_parameters(parameters: Mapping[str, Any]) -> str | None:
    """The ``config`` parameter of a load request (Triton's: a model configuration as
    JSON text), None without one; any other parameter is refused, saying what is taken."""
    for name, value in parameters.items():
        if name != "config":
            raise Unsupported(
                f"load parameter {name!r} is not supported: sordino takes 'config' (the "
                "model's configuration as JSON text) and loads the model's files from its "
                "repository folder (no file: uploads); send the load without it"
            )
        if not isinstance(value, str):
            raise InvalidRequest(
                "load parameter 'config' must be a string: the model configuration as JSON "
                "text (json.dumps of it)"
            )
    config = parameters.get("config")
    return None if config is None else str(config)


def _check_name(name: str) -> None:
    """Refuse anything but a model name: a name is looked up, never used as a path."""
    if not is_model_name(name):
        shown = repr(name) if len(name) <= 60 else repr(name[:57]) + "…"
        raise InvalidRequest(
            f"{shown} is not a model name: use letters, digits, '_', '.' and '-', starting "
            "with a letter or digit (no '/', no '..')"
        )


def _stamp(source: ModelSource) -> _Stamp | None:
    """What identifies a model version cheaply: its file's path, modification time and
    size, and its configuration as read now (``config.yaml`` or ``config.pbtxt``: an
    edited one makes a load, or a poll, reload the model, as on Triton)."""
    try:
        stat = source.path.stat()
    except OSError:
        return None
    return (str(source.path), stat.st_mtime_ns, stat.st_size, source.config)
