"""Streaming: several responses per request, from step models, through the one core.

A streaming (step) model runs one step per call of its backend (see
``backends/base.py``). :func:`stream_responses` drives one request through its steps:
each step is queued on the model's scheduler like any request, so steps of different
requests share batches and keep their priority and deadline, and each step's outputs
are one response. A model that does not stream yields exactly one response, so every
model can be called through the streaming endpoints.

If the consumer stops iterating or its task is cancelled (the client went away), the
step waiting in the queue is removed and counted as cancelled and no further step is
queued.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import numpy as np

from sordino.config.models import StreamingConfig
from sordino.errors import InferenceFailed, ModelLoadError
from sordino.inference import InferRequest, InferResponse, ModelMetadata, StreamSpec

if TYPE_CHECKING:
    from sordino.server.runtime import Runtime

__all__ = ["stream_responses", "stream_spec_for"]


def stream_spec_for(config: StreamingConfig, metadata: ModelMetadata) -> StreamSpec:
    """Check a model's ``streaming:`` configuration against the model; return its spec.

    Every carried output must exist and match the input it feeds (datatype and
    shape), and ``done`` must be a BOOL output. Raises ModelLoadError naming the
    mismatch otherwise.
    """
    model = metadata.name
    for output_name, input_name in config.carry.items():
        output = metadata.output(output_name)
        target = metadata.input(input_name)
        if output is None:
            raise ModelLoadError(
                f"model {model!r}: streaming.carry names output {output_name!r}, but the "
                f"model's outputs are {', '.join(s.name for s in metadata.outputs)}"
            )
        if target is None:
            raise ModelLoadError(
                f"model {model!r}: streaming.carry feeds input {input_name!r}, but the "
                f"model's inputs are {', '.join(s.name for s in metadata.inputs)}"
            )
        if (output.datatype, output.shape) != (target.datatype, target.shape):
            raise ModelLoadError(
                f"model {model!r}: streaming.carry feeds output {output_name!r} "
                f"({output.datatype} {list(output.shape)}) into input {input_name!r} "
                f"({target.datatype} {list(target.shape)}); they must match"
            )
    done = metadata.output(config.done)
    if done is None or done.datatype != "BOOL":
        raise ModelLoadError(
            f"model {model!r}: streaming.done must name a BOOL output; "
            f"{config.done!r} is {'not an output' if done is None else done.datatype}"
        )
    return StreamSpec(
        carry=tuple(config.carry.items()), done=config.done, max_steps=config.max_steps
    )


async def stream_responses(
    runtime: Runtime, request: InferRequest
) -> AsyncIterator[tuple[InferResponse, bool]]:
    """Yield ``(response, final)`` for each response to ``request``; ``final`` marks the last.

    Validation and admission happen before the first step, so a refused request
    raises before anything is yielded. Errors of a later step raise from the
    iteration (the responses already yielded stand).
    """
    model, context = runtime.admit(request)
    spec = model.metadata.stream
    inputs = dict(request.inputs)
    steps = 1 if spec is None else spec.max_steps
    for _ in range(steps):
        outputs = await model.scheduler.infer(
            inputs,
            priority=context.priority,
            timeout_s=context.timeout_s,
            request_id=request.id,
        )
        final = spec is None or bool(np.all(outputs[spec.done]))
        yield runtime.response(model, request, outputs), final
        if final:
            return
        assert spec is not None
        for output_name, input_name in spec.carry:
            inputs[input_name] = outputs[output_name]
    raise InferenceFailed(
        f"model {model.key} streamed {steps} responses without setting "
        f"{spec.done if spec else 'done'!r}; raise streaming.max_steps or fix the model"
    )
