"""Building the responses the service hands to the transports.

A response carries the outputs the request asked for (all of them by default), with
the datatypes the model declares; an output asked for with ``classification: k``
becomes its top k (``server/classification.py``). An iterative model's answers are
its progress previews and its final image with the PNG and how it was made.
"""

from __future__ import annotations

import numpy as np

from sordino.datatypes import from_numpy_dtype
from sordino.errors import TensorError
from sordino.generation.pipeline import Progress
from sordino.generation.reuse import Generated
from sordino.inference import InferRequest, InferResponse, Tensor
from sordino.memory.refs import Tensors
from sordino.server.classification import classify
from sordino.server.route import Route

__all__ = ["generated_response", "progress_response", "response"]


def response(route: Route, request: InferRequest, outputs: Tensors) -> InferResponse:
    """The response to ``request``: the outputs it asked for (it owns ``outputs``), with
    the parameters the model gave with them."""
    picked = outputs
    parameters = outputs.parameters
    datatypes = route.output_datatypes
    wanted_outputs = request.outputs
    if wanted_outputs:
        wanted = {o.name for o in wanted_outputs}
        chosen = {
            spec.name: (outputs, spec.name)
            for spec in route.metadata.outputs
            if spec.name in wanted and spec.name in outputs  # (a model may leave one out)
        }
        if len(chosen) < len(outputs):
            picked = Tensors.compose(chosen)
            outputs.release()
        if any("classification" in o.parameters for o in wanted_outputs):
            model = route.model
            picked, datatypes = classify(
                request, picked, dict(datatypes), model.labels, batched=route.metadata.batched
            )
    if route.model.outputs_as_made:
        datatypes = _as_made(picked, datatypes)
    return InferResponse(
        model=route.key.name,
        version=route.key.version,
        outputs=picked,
        output_datatypes=dict(datatypes),
        id=request.id,
        parameters=parameters if parameters is not None else {},
    )


def _as_made(outputs: Tensors, datatypes: dict[str, str]) -> dict[str, str]:
    """``datatypes``, each output's that its array contradicts replaced by the array's
    own (a Triton Python model's answer, as Triton reports it: no cast either way)."""
    changed: dict[str, str] | None = None
    for name, array in outputs.items():
        try:
            actual = from_numpy_dtype(array.dtype)
        except TensorError:
            continue  # no KServe datatype: the encoder says so
        if actual != datatypes.get(name):
            if changed is None:
                changed = dict(datatypes)
            changed[name] = actual
    return datatypes if changed is None else changed


def progress_response(route: Route, request: InferRequest, progress: Progress) -> InferResponse:
    """A generation's progress: the current preview image and the step it is at."""
    return InferResponse(
        model=route.key.name,
        version=route.key.version,
        outputs=Tensors.of({"image": progress.preview}),
        output_datatypes={"image": "UINT8"},
        id=request.id,
        parameters={"step": progress.step, "steps": progress.steps},
    )


def generated_response(
    route: Route, request: InferRequest, result: Generated, how: str
) -> InferResponse:
    """A generation's final answer: the image, its PNG(s) and how it was made."""
    outputs: dict[str, Tensor] = {
        "image": result.image,
        "png": np.array(list(result.pngs) or [result.png], dtype=object),
    }
    if request.outputs:
        wanted = {o.name for o in request.outputs}
        outputs = {name: array for name, array in outputs.items() if name in wanted}
    return InferResponse(
        model=route.key.name,
        version=route.key.version,
        outputs=Tensors.of(outputs),
        output_datatypes={"image": "UINT8", "png": "BYTES"},
        id=request.id,
        parameters={
            "steps_used": result.steps_used,
            "steps_requested": result.steps_requested,
            "seed": result.seed,
            "degraded": result.degraded,
            "reused_steps": result.reused_steps,
            "cached_steps": result.cached_steps,
            "source": how,
        },
    )
