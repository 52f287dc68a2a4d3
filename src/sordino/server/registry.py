"""The model registry: which model versions are loaded, and finding the one to serve."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sordino.errors import NotFound, ShuttingDown
from sordino.inference import ModelKey, ModelMetadata
from sordino.models.repository import ModelSource
from sordino.records import SchedulerStatistics
from sordino.scheduling.modes import BatchCurve, build_controller
from sordino.scheduling.scheduler import ModelScheduler
from sordino.scheduling.settings import ModelScheduling
from sordino.server.route import Route

if TYPE_CHECKING:
    from sordino.generation.pipeline import Pipeline
    from sordino.server.sequences import Sequences

__all__ = ["LoadedModel", "ModelRegistry", "version_key"]


@dataclass(slots=True)
class LoadedModel:
    """One served model version: where it came from, what it takes, its scheduler."""

    source: ModelSource
    key: ModelKey
    metadata: ModelMetadata
    scheduling: ModelScheduling
    scheduler: ModelScheduler
    curve: BatchCurve | None = None
    instances: int = 1
    pipeline: Pipeline | None = None
    """Set for an iterative model: the generator in front of its denoiser."""
    labels: dict[str, list[str]] = field(default_factory=dict)
    """Class labels per output for the classification extension (``*``: every output)."""
    sequences: Sequences | None = None
    """Set for a model with ``sequence_batching``: its live sequences."""
    request_facts: bool = False
    """Whether its backend reads each request's facts (``BackendKind.request_facts``)."""
    outputs_as_made: bool = False
    """Whether its outputs are answered in the datatype they have
    (``BackendKind.outputs_as_made``), not only in the one it declares."""
    route: Route | None = None
    """Where its requests go (:class:`Route`), set when the registry adds it."""

    @property
    def max_batch_size(self) -> int:
        return self.scheduling.max_batch_size

    def reschedule(self, scheduling: ModelScheduling) -> None:
        """Schedule under ``scheduling`` from the next decision on (queued and running
        work stays as it is); nothing when it is the one in use."""
        if scheduling == self.scheduling:
            return
        controller = build_controller(
            scheduling.mode, scheduling.policy, scheduling.slo_s, self.curve
        )
        self.scheduler.retune(controller, scheduling.queue)
        self.scheduling = scheduling


class ModelRegistry:
    """Loaded model versions by name and version; refuses lookups once shutdown began."""

    def __init__(self) -> None:
        self._models: dict[str, dict[str, LoadedModel]] = {}
        # The version served when none is asked for, per name: looked up several times
        # per request, so kept up to date on add/remove rather than found by max() each
        # time (issue 16).
        self._newest: dict[str, LoadedModel] = {}
        self.stopping = False

    def add(self, model: LoadedModel) -> None:
        """Serve ``model``; one of the same version (a reload's old load) it replaces."""
        model.route = Route.of(model)
        self._models.setdefault(model.key.name, {})[model.key.version] = model
        self._update_newest(model.key.name)

    def _update_newest(self, name: str) -> None:
        versions = self._models.get(name)
        if versions:
            self._newest[name] = versions[max(versions, key=version_key)]
        else:
            self._newest.pop(name, None)

    def contains(self, name: str, version: str) -> bool:
        return version in self._models.get(name, {})

    def has(self, name: str) -> bool:
        """Whether some version of ``name`` is loaded (cheaper than :meth:`versions`)."""
        return name in self._models  # remove() drops a name with no versions left

    def remove(self, name: str, version: str) -> LoadedModel:
        """Take one version out of service; raise NotFound if it is not loaded."""
        versions = self._models.get(name, {})
        model = versions.pop(version, None)
        if model is None:
            raise NotFound(f"model {name!r} version {version!r} is not loaded")
        if not versions:
            self._models.pop(name, None)
        self._update_newest(name)
        return model

    def loaded(self, name: str, version: str) -> LoadedModel:
        """Loaded version ``version`` of ``name``, shutting down or not; NotFound if it is
        not loaded."""
        model = self._models.get(name, {}).get(version)
        if model is None:
            raise NotFound(f"model {name!r} version {version!r} is not loaded")
        return model

    def models(self) -> list[LoadedModel]:
        """Every loaded model version, by name then version."""
        return [
            model
            for name in sorted(self._models)
            for _, model in sorted(self._models[name].items(), key=lambda kv: version_key(kv[0]))
        ]

    def newest(self, name: str) -> LoadedModel | None:
        """The version of ``name`` served by default, shutting down or not (for work
        already accepted, such as a pipeline's next node while the server drains)."""
        return self._newest.get(name)

    def get(self, name: str, version: str | None = None) -> LoadedModel:
        """Return the model version to serve (the highest loaded when ``version`` is None)."""
        if self.stopping:
            raise ShuttingDown("the server is shutting down; retry on another replica")
        if not version:
            newest = self._newest.get(name)
            if newest is not None:
                return newest
        versions = self._models.get(name)
        if not versions:
            known = ", ".join(sorted(self._models)) or "none"
            raise NotFound(
                f"Request for unknown model: '{name}' is not found (sordino: unknown model "
                f"{name!r}; loaded models: {known})"
            )
        if version is None or version == "":
            return versions[max(versions, key=version_key)]
        model = versions.get(version)
        if model is None:
            raise NotFound(
                f"Request for unknown model: '{name}' version {version} is not found "
                f"(sordino: model {name!r} has no version {version!r}; loaded versions: "
                f"{', '.join(sorted(versions, key=version_key))})"
            )
        return model

    def route(self, name: str, version: str | None = None) -> Route:
        """The route to the model version :meth:`get` returns (one lookup a request)."""
        if not version and not self.stopping:
            newest = self._newest.get(name)
            if newest is not None and newest.route is not None:
                return newest.route  # the common case, in one call
        route = self.get(name, version).route
        assert route is not None  # set by add()
        return route

    def versions(self, name: str) -> list[str]:
        """Return the loaded versions of ``name``, ascending."""
        return sorted(self._models.get(name, {}), key=version_key)

    def scheduler_statistics(self) -> list[SchedulerStatistics]:
        """Every loaded model's scheduler statistics."""
        return [model.scheduler.statistics() for model in self.models()]


def version_key(version: str) -> tuple[int, str]:
    """Sort numeric versions numerically, after them any others by name."""
    return (int(version), "") if version.isdigit() else (1 << 62, version)
