"""The server's end of a decoupled batch: every request ends once, whatever ends it."""

from __future__ import annotations

import numpy as np

from sordino.errors import SordinoError
from sordino.execution.decoupled import ResponseChannel
from sordino.testing.clock import VirtualClock


class _Seen:
    def __init__(self) -> None:
        self.responses: list[tuple[int, list[int], bool]] = []
        self.errors: list[tuple[int, str]] = []
        self.cancelled: list[int] = []
        self.model_errors: list[tuple[int, str, str, bool]] = []

    def channel(self, count: int) -> ResponseChannel:
        channel = ResponseChannel(
            "m/1",
            count,
            self._response,
            lambda i, message: self.errors.append((i, message)),
        )
        channel.bind(self.cancelled.append)
        return channel

    def _response(self, i: int, outputs: dict[str, np.ndarray] | SordinoError, final: bool) -> None:
        if isinstance(outputs, SordinoError):
            self.model_errors.append((i, type(outputs).__name__, str(outputs), final))
        else:
            self.responses.append((i, [int(v) for v in outputs.get("Y", np.zeros(0))], final))


def test_responses_flow_until_the_final_one_and_later_ones_are_dropped() -> None:
    seen = _Seen()
    channel = seen.channel(2)
    channel.response(1, {"Y": np.array([5])}, False, None)
    channel.response(1, {}, True, None)
    channel.response(1, {"Y": np.array([6])}, False, None)  # after its final: dropped
    assert seen.responses == [(1, [5], False), (1, [], True)]
    assert channel.streamed and not channel.finished
    channel.response(0, {}, True, None)
    assert channel.finished and seen.errors == []


def test_an_error_response_is_a_response_and_ends_its_request_only_when_final() -> None:
    """The model's error (its message as written, the kind its code says) is one
    response of the stream; with the final flag nothing comes after it."""
    seen = _Seen()
    channel = seen.channel(1)
    channel.response(0, {}, False, "bad step", 3)
    channel.response(0, {"Y": np.array([1])}, False, None)
    channel.response(0, {}, True, "bad input", 4)
    channel.response(0, {"Y": np.array([2])}, False, None)
    assert seen.model_errors == [
        (0, "ModelRejected", "bad step", False),
        (0, "ModelResponseError", "bad input", True),
    ]
    assert seen.responses == [(0, [1], False)] and seen.errors == [] and channel.finished


def test_a_cancelled_request_tells_the_model_once_and_hears_nothing_more() -> None:
    seen = _Seen()
    channel = seen.channel(2)
    channel.cancel(0)
    channel.cancel(0)
    channel.response(0, {"Y": np.array([1])}, False, None)
    assert seen.cancelled == [0] and seen.responses == []
    channel.fail("the worker was lost")
    assert seen.errors == [(1, "the worker was lost")] and channel.finished


async def test_the_execution_timeout_ends_what_is_still_open() -> None:
    clock = VirtualClock()
    seen = _Seen()
    channel = seen.channel(3)
    channel.limit(clock, 5.0)
    channel.response(0, {}, True, None)
    await clock.advance(4.9)
    assert seen.errors == []
    await clock.advance(0.2)
    assert [i for i, _ in seen.errors] == [1, 2] and seen.cancelled == [1, 2]
    assert "model m/1 did not finish its responses" in seen.errors[0][1]
    assert "execution timeout of 5 s" in seen.errors[0][1]
    assert channel.finished


async def test_a_finished_batch_leaves_no_timer() -> None:
    clock = VirtualClock()
    seen = _Seen()
    channel = seen.channel(1)
    channel.limit(clock, 5.0)
    channel.response(0, {}, True, None)
    await clock.advance(10)
    assert seen.errors == [] and seen.cancelled == []
