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

import numpy as np

from sordino.datatypes import to_numpy_dtype
from sordino.errors import TensorError, Unsupported
from sordino.inference import InferRequest, ModelKey, ModelMetadata

if TYPE_CHECKING:
    from sordino.scheduling.scheduler import ModelScheduler
    from sordino.server.registry import LoadedModel

__all__ = ["Route", "Way", "fill_initial_state", "refuse_one_shot"]

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
    cached: bool = False
    """Whether the model's answers may come from the response cache (it enables
    ``response_cache``; one response per request)."""

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
            cached=way == "infer" and model.source.config.response_cache,
        )

    @property
    def max_batch_size(self) -> int:
        """The model's batch limit now (a live reconfiguration may change it)."""
        return self.model.scheduling.max_batch_size


def refuse_one_shot(route: Route) -> None:
    """Refuse a one-shot request to a model whose answers are streams."""
    if route.metadata.stream is not None or route.metadata.decoupled:
        how = (
            "is decoupled (it sends any number of responses per request, as Triton's "
            "decoupled transaction policy); its inference endpoints are the streams"
            if route.metadata.decoupled
            else "streams its responses (one per step)"
        )
        raise Unsupported(
            f"model {route.key.name!r} {how}: use ModelStreamInfer over gRPC or POST "
            f"/v2/models/{route.key.name}/generate_stream over HTTP"
        )


def fill_initial_state(request: InferRequest, route: Route, names: tuple[str, ...]) -> None:
    """Give a step model's state inputs (fed by its carry, never by the client) zeros."""
    metadata = route.metadata
    inputs = dict(request.inputs)
    rows = 1
    if metadata.batched and inputs:
        rows = int(next(iter(inputs.values())).shape[0])
    for name in names:
        if name in inputs:
            raise TensorError(
                f"input {name!r} of model {route.key.name!r} is the model's own state (fed "
                "from its previous step); leave it out of the request"
            )
        spec = metadata.input(name)
        assert spec is not None  # checked at load
        shape = [max(dim, 1) for dim in spec.shape]
        if metadata.batched:
            shape[0] = rows
        inputs[name] = np.zeros(shape, dtype=to_numpy_dtype(spec.datatype))
        request.input_datatypes[name] = spec.datatype
    request.inputs = inputs
