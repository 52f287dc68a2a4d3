"""``Soon``: a one-shot request answered by callback gives back its ticket once, answers
once, and a cancel — before or after its outputs arrive — answers nothing and releases
what it got."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import numpy as np

from sordino.errors import InferenceFailed
from sordino.inference import InferRequest, InferResponse
from sordino.memory.refs import Tensors
from sordino.scheduling.work import Outbox, StepOutput
from sordino.server.infer_soon import Soon


class _Outputs(Tensors):
    """Tensors that record their release."""

    released = 0

    def release(self) -> None:
        type(self).released += 1


def _soon() -> tuple[Soon, Any, list[Any], list[Any], list[Any]]:
    accepted = SimpleNamespace(outputs=Outbox(), outcome=None, finished=False)
    cancelled: list[Any] = []
    released: list[Any] = []
    answered: list[Any] = []
    route = SimpleNamespace(
        model=SimpleNamespace(outputs_as_made=False),
        scheduler=SimpleNamespace(cancel=cancelled.append),
        key=SimpleNamespace(name="m", version="1"),
        output_datatypes={"y": "FP32"},
        metadata=SimpleNamespace(outputs=[]),
    )
    ticket = SimpleNamespace(release=released.append)
    request = InferRequest(model="m", inputs={})
    soon = Soon(route, request, accepted, ticket, answered.append)  # type: ignore[arg-type]
    return soon, accepted, cancelled, released, answered


def _outputs() -> _Outputs:
    return _Outputs.of({"y": np.zeros((1, 2), np.float32)})  # type: ignore[return-value]


async def test_the_response_is_answered_once_with_the_scheduler_s_outcome() -> None:
    soon, accepted, cancelled, released, answered = _soon()
    accepted.outcome = "ok"
    accepted.outputs.put_nowait(StepOutput(_outputs(), True, 0))
    await asyncio.sleep(0)
    assert len(answered) == 1 and isinstance(answered[0], InferResponse)
    assert released == ["ok"] and cancelled == []
    soon.cancel()  # too late: nothing more happens
    assert released == ["ok"] and cancelled == []


async def test_an_error_is_answered_as_the_error() -> None:
    _, accepted, _, released, answered = _soon()
    accepted.outcome = "error"
    failure = InferenceFailed("the model failed")
    accepted.outputs.put_nowait(failure)
    await asyncio.sleep(0)
    assert answered == [failure] and released == ["error"]


async def test_a_cancel_while_queued_cancels_it_and_answers_nothing() -> None:
    soon, accepted, cancelled, released, answered = _soon()
    soon.cancel()
    await asyncio.sleep(0)
    assert cancelled == [accepted] and released == ["cancelled"] and answered == []


async def test_a_cancel_after_the_outputs_arrived_releases_them_and_answers_nothing() -> None:
    soon, accepted, cancelled, released, answered = _soon()
    before = _Outputs.released
    accepted.outcome = "ok"
    accepted.outputs.put_nowait(StepOutput(_outputs(), True, 0))
    soon.cancel()  # the callback is scheduled, not run yet
    await asyncio.sleep(0)
    assert answered == [] and released == ["ok"] and cancelled == [accepted]
    assert _Outputs.released == before + 1
