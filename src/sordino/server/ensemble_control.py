"""A model repository's Triton ensembles under model control, as Triton treats them.

Model control (:mod:`sordino.server.model_control`) keeps the set of ensembles that were
asked for (loaded at start-up, by a load request, or found by a poll) and serves each
one while every model it runs is served:

- loading an ensemble loads the models it runs first (ensembles among them), then
  builds it; loading it again after its ``config.pbtxt`` changed rebuilds it;
- unloading a model an ensemble runs takes the ensemble out of service first (it
  drains while the model is still there), and loading that model again brings the
  ensemble back; loading a new or changed version of such a model rebuilds the
  ensemble against it;
- unloading an ensemble drains it; with Triton's ``unload_dependents`` the models it
  runs are unloaded too.

An ensemble is drained as a model is: requests already accepted still get their
answer, requests that arrive meanwhile get 404 (no such model). An ensemble rebuilt
(its configuration, or a model it runs, changed) is built first and takes the old one's
place in one step; the old one then drains: requests for it are answered throughout.
Pipelines of the configuration's ``pipelines`` section are not the repository's: they
are served from start-up on and stay.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from sordino.config.pipelines import PipelineConfig, nodes_first
from sordino.errors import SordinoError
from sordino.models.ensembles import is_ensemble
from sordino.server.pipelines import PipelineExecutor, build_pipeline, outer_first
from sordino.server.registry import LoadedModel
from sordino.server.response_cache import warn_uncached

if TYPE_CHECKING:
    from sordino.models.repositories import Repositories
    from sordino.server.runtime import Runtime

__all__ = ["EnsembleSet", "retire_pipeline", "serve_pipeline"]

log = logging.getLogger("sordino.control")


def serve_pipeline(
    runtime: Runtime, config: PipelineConfig, replacing: LoadedModel | None = None
) -> LoadedModel:
    """Build the pipeline ``config`` against the models served now and serve it (in
    ``replacing``'s place, in one step, when given: retire that one after)."""
    served = build_pipeline(
        config,
        runtime.registry,
        runtime.config.scheduler,
        clock=runtime.clock,
        observers=runtime.observers,
        executor=runtime.executor,
        pools=runtime.memory.pools,
        replacing=replacing,
    )
    runtime.registry.add(served)
    runtime.pipelines.append(served)
    runtime.events.emit("model_loaded", str(served.key), pipeline=len(config.nodes))
    if config.response_cache and runtime.response_cache is None:
        warn_uncached(f"pipeline {config.name}")
    return served


async def retire_pipeline(
    runtime: Runtime, pipeline: LoadedModel, *, replaced: bool = False
) -> None:
    """Take ``pipeline`` out of service (``replaced``: another serves in its place
    already); the requests it accepted still finish."""
    if not replaced:
        runtime.registry.remove(pipeline.key.name, pipeline.key.version)
    runtime.pipelines.remove(pipeline)
    await pipeline.scheduler.close(drain=True, replaced=replaced)
    if runtime.response_cache is not None:  # rebuilt, it may answer otherwise
        runtime.response_cache.forget(pipeline.key)
    runtime.events.emit(
        "model_unloaded", str(pipeline.key), "rebuilt: the new one serves" if replaced else ""
    )


def pipeline_config(pipeline: LoadedModel) -> PipelineConfig:
    """The configuration ``pipeline`` was built from."""
    executor = pipeline.scheduler.executor
    assert isinstance(executor, PipelineExecutor)
    return executor.config


class EnsembleSet:
    """The ensembles of one runtime's model repository that are asked for, and the
    work of keeping each served while the models it runs are."""

    def __init__(self, runtime: Runtime, repositories: Repositories) -> None:
        self.runtime = runtime
        self.repositories = repositories
        self.wanted: dict[str, PipelineConfig] = {}
        self._stale: set[str] = set()
        self._mine: set[str] = set()  # the pipelines served as the repository's ensembles
        self.failed: dict[str, str] = {}

    def adopt(self) -> None:
        """Ask for the repository's ensembles served now (those built at start-up)."""
        for pipeline in self.runtime.pipelines:
            if self.owns(pipeline.key.name) and pipeline.key.name not in self._mine:
                self._mine.add(pipeline.key.name)
                self.wanted[pipeline.key.name] = pipeline_config(pipeline)

    def owns(self, name: str) -> bool:
        """Whether ``name`` is an ensemble folder of the repository."""
        try:
            folder = self.repositories.folder(name)
        except SordinoError:  # in two repositories: the load says so
            return False
        return folder is not None and is_ensemble(folder)

    def served(self) -> dict[str, LoadedModel]:
        """The repository's ensembles in service, by name."""
        return {p.key.name: p for p in self.runtime.pipelines if p.key.name in self._mine}

    def users_of(self, names: Iterable[str]) -> set[str]:
        """The wanted ensembles that run any of ``names``, directly or through another."""
        found: set[str] = set()
        todo = set(names)
        while todo:
            users = {e for e, c in self.wanted.items() if any(n.model in todo for n in c.nodes)}
            todo = users - found
            found |= users
        return found

    def rebuild_users_of(self, name: str) -> None:
        """Rebuild the ensembles that run ``name`` at the next :meth:`settle` (a new or
        changed version of it is served)."""
        self._stale |= self.users_of([name])

    async def settle(self, leaving: Iterable[str] = ()) -> None:
        """Serve each wanted ensemble whose models are all served, and take out of
        service those no longer wanted, changed, or running a model that is not served
        (or is in ``leaving``: about to be unloaded)."""
        registry = self.runtime.registry
        gone = set(leaving)
        served = self.served()
        out = {
            name
            for name, pipeline in served.items()
            if self.wanted.get(name) != pipeline_config(pipeline)
            or name in self._stale
            or any(
                n.model in gone or not registry.versions(n.model) for n in self.wanted[name].nodes
            )
        }
        out |= self.users_of(out) & set(served)  # an outer one runs an inner one going out
        again = self._servable_again(out, gone)
        for layer in outer_first([served[name] for name in out - again]):
            for pipeline in layer:
                self._mine.discard(pipeline.key.name)
                await retire_pipeline(self.runtime, pipeline)
        self._stale.clear()
        replaced: list[LoadedModel] = []
        for config in nodes_first(self.wanted.values()):
            old = served[config.name] if config.name in again else None
            if old is None and (
                registry.versions(config.name)
                or any(n.model in gone or not registry.versions(n.model) for n in config.nodes)
            ):
                continue
            try:
                serve_pipeline(self.runtime, config, replacing=old)
                self._mine.add(config.name)
            except SordinoError as exc:
                self.failed[config.name] = str(exc)
                log.error("ensemble %r cannot be served: %s", config.name, exc)
                if old is not None:  # out of service, as it would have been before
                    self._mine.discard(config.name)
                    await retire_pipeline(self.runtime, old)
            else:
                self.failed.pop(config.name, None)
                if old is not None:
                    replaced.append(old)
        for layer in outer_first(replaced):  # each drains once its rebuilt one serves
            for pipeline in layer:
                await retire_pipeline(self.runtime, pipeline, replaced=True)

    def _servable_again(self, out: set[str], gone: set[str]) -> set[str]:
        """Those of ``out`` (ensembles going out of service) that are still wanted and
        whose models all stay served: each is rebuilt and takes the old one's place in
        one step, so that requests for it are answered throughout."""
        registry = self.runtime.registry
        again = {
            name
            for name in out
            if name in self.wanted
            and not any(
                n.model in gone or not registry.versions(n.model) for n in self.wanted[name].nodes
            )
        }
        while True:  # an ensemble running one that goes for good goes too
            dropped = {
                name
                for name in again
                if any(n.model in out - again for n in self.wanted[name].nodes)
            }
            if not dropped:
                return again
            again -= dropped
