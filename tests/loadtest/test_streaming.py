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
