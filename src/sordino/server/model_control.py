"""Model control: load, reload and unload models while the server runs (Triton's modes).

``none``: the models loaded at start-up are served until shutdown; load and unload
are refused. ``explicit``: the load and unload endpoints (HTTP, gRPC, ``sordino
models``) change what is served. ``poll``: the model repository is rescanned every
``server.repository_poll_secs`` and what is served follows it; load and unload are
refused. As on Triton, ``none`` and ``poll`` start with every configured model loaded,
``explicit`` with those ``--load-model`` names (``sordino start``); a model left out at
start (``server.exit_on_error`` false) is UNAVAILABLE with its error until it loads.

Loading a model (re)reads its repository folder (or its start-up configuration) and
brings the served versions in line with it: new versions are loaded first, versions
whose file changed are reloaded, and versions no longer selected are unloaded last,
with a drain, so requests already queued on them still finish and new requests go to
the versions that stay. A version reloaded is served throughout: its new load warms up
beside the old one and takes its place once ready (:meth:`ModelLoader.reload`); a
reload that fails leaves the old one serving. Control operations run one at a time.
A repository's Triton ensembles are loaded and unloaded too, with the models they run
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
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Any

from sordino.config import ModelConfig
from sordino.config.pipelines import PipelineConfig
from sordino.errors import ConfigError, NotFound, SordinoError, Unsupported
from sordino.models.ensembles import ensemble_pipeline
from sordino.models.repositories import Repositories
from sordino.models.repository import ModelSource, load_repository_model, sources_for
from sordino.server.control_records import (
    IndexEntry,
    ModelControlStatistics,
    PollFailures,
    Stamp,
    check_name,
    stamp,
)
from sordino.server.ensemble_control import EnsembleSet
from sordino.server.model_uploads import (
    LoadRequest,
    Uploads,
    discard,
    load_parameters,
    read_config,
)
from sordino.server.runtime import Runtime

__all__ = ["IndexEntry", "LoadRequest", "ModelControl", "ModelControlStatistics", "load_parameters"]

log = logging.getLogger("sordino.control")


class ModelControl:
    """Loads and unloads the models of one runtime on request or by polling."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        server = runtime.config.server
        self.mode = server.model_control_mode
        self.repositories = Repositories(runtime.config.repositories)
        self.poll_s = server.repository_poll_secs
        self._configs: dict[str, ModelConfig] = {}
        self._stamps: dict[tuple[str, str], Stamp | None] = {}
        self.ensembles = EnsembleSet(runtime, self.repositories)
        self._transient: dict[tuple[str, str], str] = {}
        self._failed: dict[str, str] = {}
        self._poll_failures = PollFailures()
        self._last_versions: dict[str, list[str]] = {}
        self._asked: set[str] = set()  # models loaded by name, not only as an ensemble's
        self._overrides: dict[str, dict[str, Any]] = {}  # a load's config, by model
        self._uploads = Uploads()  # the folders of models loaded from a load's files
        self._uploaded: set[str] = set()  # models ever loaded from uploaded files
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._loads = self._reloads = self._unloads = self._failures = self._polls = 0
        self._updates = 0
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
                # (Read only by loads and polls: a model's folder is not walked at
                # start-up for model control "none", which takes neither.)
                self._stamps[key] = stamp(model.source) if self.mode != "none" else None
        self.ensembles.adopt()
        self._failed.update(self.runtime.failed_at_start)  # left out at start: UNAVAILABLE
        steps = {n.model for c in self.ensembles.wanted.values() for n in c.nodes}
        self._asked |= {m.key.name for m in self.runtime.models()} - steps
        self._remember()

    def start(self) -> None:
        """Take in the start-up models (the runtime has started); start polling the
        repository (``poll`` mode only)."""
        self._adopt()
        self.runtime.model_calls.control = self  # models' pb_utils.load_model from now on
        if self.mode == "poll" and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._poll_loop(), name="sordino-repository-poll"
            )

    async def close(self) -> None:
        """Stop polling; an operation in progress finishes first. Uploaded model
        folders are removed (the runtime stops after this)."""
        self.runtime.model_calls.control = None
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._uploads.close()

    # -- the operations --------------------------------------------------------------

    def index(self, *, ready_only: bool = False) -> list[IndexEntry]:
        """Every model the server knows: loaded versions, and models it could load."""
        names = set(self._configs) | {m.key.name for m in self.runtime.models()}
        names |= set(self._repository_names()) | set(self._failed)
        twice = self.repositories.twice()
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
            failed = self._failed.get(name) or self.ensembles.failed.get(name)
            reason = "model appears in two or more repositories" if name in twice else failed
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

    async def load(
        self, name: str, request: LoadRequest | None = None, *, within: str = ""
    ) -> None:
        """Load or reload ``name`` (``explicit`` mode only); an ensemble brings the
        models it runs. ``request.config``: a Triton configuration (JSON text) used
        instead of the folder's, as on Triton, from now on until the model is unloaded
        (a later load without one keeps it). ``request.files``: the model's whole folder
        (``server/model_uploads.py``), loaded instead of the repository's for this load
        only: a later load without files reads the repository again, as on Triton.
        ``within``: the model whose code asks (``pb_utils.load_model``; see ``_turn``)."""
        request = request or LoadRequest()
        self._require_explicit("load")
        check_name(name)
        self._refuse_pipeline(name, "load")
        if request.files and self.ensembles.owns(name):
            raise Unsupported(
                f"{name!r} is an ensemble of the repository: it takes no uploaded files "
                "(not supported); load it without file: parameters"
            )
        configured = name in self._configs and name not in self._uploaded
        in_repository = name in self._repository_names()
        if request.files and configured and not in_repository:
            raise Unsupported(
                f"model {name!r} is a model of sordino's configuration: it takes no "
                "uploaded files (not supported); give its files another name"
            )
        given = None
        if request.config is not None:
            given = read_config(name, request, in_repository)
        root = None
        if request.files:  # written off the loop (a model's files may be large)
            root = await asyncio.to_thread(self._uploads.write, name, request.files)
        served = False
        try:
            async with self._turn(within), self._journaled("load", name):
                before = self._overrides.get(name)
                was = self._uploads.use(name, root)
                if given is not None:
                    self._overrides[name] = given
                elif was is not None:  # back to the repository: the upload's config goes
                    self._overrides.pop(name, None)
                try:
                    await self._load(name)
                except BaseException:
                    self._uploads.use(name, was)  # a load that failed leaves what it had
                    self._overrides.pop(name, None)
                    if before is not None:
                        self._overrides[name] = before
                    raise
                served = True
                discard(was)
                if root is not None:
                    self._uploaded.add(name)
        finally:
            if not served:
                discard(root)  # the files of a load that did not happen

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

    async def unload(self, name: str, *, unload_dependents: bool = False, within: str = "") -> None:
        """Unload every version of ``name`` after its queued requests finish; the
        ensembles that run it drain first. ``unload_dependents``: an ensemble's models
        are unloaded too (but those loaded by name, or run by another ensemble asked
        for), as on Triton. ``within``: as for :meth:`load`."""
        self._require_explicit("unload")
        check_name(name)
        self._refuse_pipeline(name, "unload")
        async with self._turn(within), self._journaled("unload", name):
            known = name in self._configs or name in self._repository_names()
            if not self.runtime.versions(name) and not known:
                raise NotFound(f"unknown model {name!r}; nothing to unload")
            await self._unload(name, unload_dependents)
            self._asked.discard(name)
            self._overrides.pop(name, None)
            discard(self._uploads.use(name, None))
            await self.ensembles.settle()

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
        try:
            folder = self.repositories.folder(name)
            assert folder is not None  # (an ensemble it owns)
            config = ensemble_pipeline(folder, self._overrides.get(name))
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
    async def _turn(self, within: str) -> AsyncIterator[None]:
        """Control operations run one at a time — but one that a model's code asks for
        (``within``: that model) while an operation holding the turn is loading that
        very model (its ``initialize`` loads the models it uses) runs inside it:
        waiting for the turn would wait for itself."""
        loading = {m for (m, _), state in self._transient.items() if state == "LOADING"}
        if within and within in loading and self._lock.locked():
            yield
            return
        async with self._lock:
            yield

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
        if not self.repositories:
            return
        async with self._lock:
            self._polls += 1
            present = self._repository_names()
            ensembles: dict[str, PipelineConfig] = {}
            for name in present:
                sources = None
                try:
                    root = self.repositories.root_of(name)
                    assert root is not None  # (a name it lists)
                    if self.ensembles.owns(name):  # after the models it runs
                        ensembles[name] = ensemble_pipeline(root / name)
                    else:
                        sources = load_repository_model(root, name)
                        if self._poll_failures.unchanged(name, sources):
                            continue
                        if await self._apply(name, sources):
                            self.ensembles.rebuild_users_of(name)
                    self._poll_failures.followed(name)
                except SordinoError as exc:  # a broken config.pbtxt or model file
                    if self._poll_failures.failed(name, sources, str(exc)):
                        log.error("repository poll: model %r: %s", name, exc)
                    if name in self.ensembles.wanted:  # an unreadable one stays as it was
                        ensembles[name] = self.ensembles.wanted[name]
            self._poll_failures.keep(present)
            for name in sorted(self._repository_loaded() - set(present)):
                await self.ensembles.settle(leaving=[name])
                await self._apply(name, [])
            self.ensembles.wanted = ensembles
            await self.ensembles.settle()
            self._remember()

    def statistics(self) -> ModelControlStatistics:
        """Return the counters of control operations."""
        return ModelControlStatistics(
            self.mode,
            self._loads,
            self._reloads,
            self._unloads,
            self._failures,
            self._polls,
            self._updates,
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
        return self.repositories.names()

    def _repository_loaded(self) -> set[str]:
        holds = self.repositories.holds
        return {m.key.name for m in self.runtime.models() if holds(m.source.path)}

    def _resolve(self, name: str) -> list[ModelSource]:
        uploaded = self._uploads.root(name)
        if uploaded is not None:
            return load_repository_model(uploaded, name, self._overrides.get(name))
        root = self.repositories.root_of(name)
        if root is not None:
            return load_repository_model(root, name, self._overrides.get(name))
        if name in self._uploaded:  # its folder went with its files
            raise NotFound(
                f"model {name!r} was loaded from files sent with a load, and the repository "
                "has no folder of that name: send its files (and config) again to load it"
            )
        config = self._configs.get(name)
        if config is not None:
            return sources_for(config)
        where = str(self.repositories) if self.repositories else "no repository"
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
                now = stamp(source)
                if version in loaded:
                    before = self._stamps.get((name, version))
                    if before == now:
                        continue
                    if (
                        now is not None
                        and before is not None
                        and now.instances_only(before)
                        and await runtime.loader.update_instances(source)
                    ):
                        self._updates += 1
                    else:
                        # Served by the load it replaces until the new one serves; if
                        # the new one fails, the old one serves on (as on Triton).
                        self._reloads += 1
                        await runtime.loader.reload(source)
                else:
                    self._loads += 1
                    await self._step(name, version, "LOADING", partial(runtime.load, source))
                changed = True
                self._stamps[(name, version)] = now
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
        self.runtime.failed_at_start.pop(name, None)  # strict readiness: loaded since
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
