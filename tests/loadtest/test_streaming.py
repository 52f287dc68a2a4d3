"""Streaming traffic in a stress-test mix: Server-Sent Events read to the end, the time
to the first event reported beside the time to the last."""

from __future__ import annotations

from pathlib import Path

import pytest

from sordino.errors import ConfigError
from sordino.loadtest.profiles import load_profile
from sordino.loadtest.results import FIRST_RESPONSE
from sordino.loadtest.run import execute, prepare
from sordino.models.repository import builtin_sources
from sordino.testing import serve_in_thread

PROFILE = """\
arrivals: constant
segments:
  - {duration: 3s, rate: 20}
mix:
  - {weight: 1, model: countdown, tag: countdown, stream: true}
  - {weight: 1, model: digits-diffusion, tag: images, stream: true,
     inputs: {prompt: "a handwritten 7", steps: 4}}
"""


@pytest.mark.timeout(120)
def test_a_mix_of_streaming_models_is_read_to_the_last_event(tmp_path: Path) -> None:
    path = tmp_path / "streams.yaml"
    path.write_text(PROFILE)
    wanted = {"countdown", "digits-diffusion"}
    with serve_in_thread(sources=[s for s in builtin_sources() if s.name in wanted]) as server:
        result = execute(prepare(server.url, None, load_profile(str(path))), poll_metrics=False)
    assert result.send.sent == 60 and result.total.errors == 0, result.errors
    assert result.total.count == 60
    for label in ("countdown", "images"):
        whole = result.groups["class"][label]
        first = result.groups[FIRST_RESPONSE][label]
        assert first.count == whole.count > 0
        # The first event comes before the last one (a countdown from up to 15, or
        # four denoising steps, sends several).
        assert first.p50_ms is not None and whole.p50_ms is not None
        assert first.p50_ms <= whole.p50_ms


def test_stream_inputs_need_a_streaming_class(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("segments:\n  - {duration: 1s, rate: 1}\nmix:\n  - {inputs: {prompt: '7'}}\n")
    with pytest.raises(ConfigError, match="set stream: true"):
        load_profile(str(path))


def test_stream_inputs_must_be_the_models(tmp_path: Path) -> None:
    path = tmp_path / "wrong.yaml"
    path.write_text(
        "segments:\n  - {duration: 1s, rate: 1}\n"
        "mix:\n  - {model: countdown, stream: true, inputs: {COUNTS: [3]}}\n"
    )
    countdown = [s for s in builtin_sources() if s.name == "countdown"]
    profile = load_profile(str(path))
    with (
        serve_in_thread(sources=countdown) as server,
        pytest.raises(ConfigError, match="'COUNTS', which the model does not have"),
    ):
        prepare(server.url, None, profile)


# A decoupled Triton Python model: N responses of 768 KiB each (every event past the
# 512 KiB line aiohttp's readline allows), then the final flag.
BIG_EVENTS_CONFIG = """
backend: "python"
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [ { name: "N", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ -1 ] } ]
"""
BIG_EVENTS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        block = np.zeros(196608, np.float32)  # as JSON, "0.0," a value: 768 KiB an event
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for _ in range(1 + n % 3):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", block)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


@pytest.mark.timeout(120)
def test_a_decoupled_model_is_streamed_and_its_large_events_read(tmp_path: Path) -> None:
    """A plain profile (no stream: true) on a decoupled model: its requests go to
    generate_stream (they were all refused 400 by …/infer, a run of client errors), and
    events larger than 512 KiB are read (the reader raised aiohttp's LineTooLong in a task
    nobody awaited: "Task exception was never retrieved", those requests never counted)."""
    from sordino.models.repository import scan_repository

    root = tmp_path / "repo"
    (root / "big_events" / "1").mkdir(parents=True)
    (root / "big_events" / "config.pbtxt").write_text(BIG_EVENTS_CONFIG)
    (root / "big_events" / "1" / "model.py").write_text(BIG_EVENTS)
    path = tmp_path / "plain.yaml"
    path.write_text("arrivals: constant\nsegments:\n  - {duration: 2s, rate: 5}\n")
    with serve_in_thread(sources=scan_repository(root)) as server:
        plan = prepare(server.url, "big_events", load_profile(str(path)))
        assert [c.stream for c in plan.classes] == [True]
        assert (
            plan.examples == "big_events: decoupled, so its requests are streams (generate_stream)"
        )
        result = execute(plan, poll_metrics=False)
    assert result.send.sent == 10
    assert result.total.count == 10 and result.total.errors == 0, result.errors
    assert result.groups[FIRST_RESPONSE]["default"].count == 10


def test_events_are_counted_whatever_the_chunks() -> None:
    from sordino.loadtest.sender import _Events

    body = (
        b'event: x\ndata: {"a": ' + b"1" * 2_000_000 + b'}\n\ndata: {"error": "boom"}\n\n'
        b": a comment\ndata: last"
    )
    for size in (1, 7, 4096, 1 << 20, len(body)):
        events = _Events()
        said = [events.feed(body[i : i + size]) for i in range(0, len(body), size)]
        assert events.count == 2 and any(said)  # the last line has no newline yet
        assert events.feed(b"\n")
        assert (events.count, events.failed) == (3, True)
