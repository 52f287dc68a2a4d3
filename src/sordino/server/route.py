"""A request's route: the model version it goes to, found once per request.

A transport looks the route up as soon as it knows the model's name (an unknown model
is answered 404 before the body is decoded) and hands it to the service with the
decoded request; nothing after it looks the model up again. The per-model facts that
do not change while the version is loaded (which way its requests take, the datatypes
of its outputs) are worked out once, when the version is registered, not per request.
The live ones (the queue policy, the batch limit, which a live reconfiguration may
change) are read through :attr:`Route.model` when they are needed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from sordino.inference import ModelKey, ModelMetadata

if TYPE_CHECKING:
    from sordino.scheduling.scheduler import ModelScheduler
    from sordino.server.registry import LoadedModel

__all__ = ["Route", "Way"]

Way = Literal["infer", "stream", "generate", "sequence"]
"""Which path a model's requests take through the service: one response per request
(``infer``), a response per step (``stream``), an iterative model's generator
(``generate``) or Triton's sequence batching (``sequence``)."""


@dataclass(frozen=True, slots=True, eq=False)
class Route:
    """Where the requests to one loaded model version go, and what they need of it."""

    model: LoadedModel
    key: ModelKey
    metadata: ModelMetadata
    scheduler: ModelScheduler
    way: Way
    output_datatypes: dict[str, str]
    """Each output's datatype, by name (what a response declares)."""

    @classmethod
    def of(cls, model: LoadedModel) -> Route:
        """The route to ``model`` (called once, when the version is registered)."""
        metadata = model.metadata
        way: Way = "infer"
        if model.pipeline is not None:
            way = "generate"
        elif model.sequences is not None:
            way = "sequence"
        elif metadata.stream is not None:
            way = "stream"
        return cls(
            model,
            model.key,
            metadata,
            model.scheduler,
            way,
            {spec.name: spec.datatype for spec in metadata.outputs},
        )

    @property
    def max_batch_size(self) -> int:
        """The model's batch limit now (a live reconfiguration may change it)."""
        return self.model.scheduling.max_batch_size
