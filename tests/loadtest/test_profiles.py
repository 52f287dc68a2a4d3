"""Profiles, schedules, payloads and conditions: the parts of stress-test that need no server."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from sordino.errors import ConfigError
from sordino.loadtest.payloads import InputSpec, build_payloads, read_data_file
from sordino.loadtest.profiles import BUILTIN_PROFILES, load_profile
from sordino.loadtest.results import Recorder, parse_conditions
from sordino.loadtest.schedule import make_schedule
from sordino.protocol.codec import decode_infer_request


@pytest.mark.parametrize("name", BUILTIN_PROFILES)
def test_builtin_profiles_load_and_scale(name: str) -> None:
    profile = load_profile(name).scaled(duration=120, peak_rate=300)
    assert profile.duration == pytest.approx(120)
    assert profile.peak() == pytest.approx(300)
    rates = profile.rate_at(np.linspace(0, 119.9, 2000))
    assert rates.max() <= 300 + 1e-6 and rates.min() >= 0


def test_spike_is_three_times_the_base_for_a_fifth_of_the_run() -> None:
    spike = load_profile("spike").scaled(duration=300, peak_rate=90)
    rates = spike.rate_at(np.arange(0, 300, 1.0))
    assert rates[60] == pytest.approx(30, rel=0.01) and rates[150] == pytest.approx(90)
    assert int((rates > 60).sum()) == 60


def test_black_friday_surges_to_three_times_the_morning_with_bursts() -> None:
    bf = load_profile("black_friday").scaled(duration=43_200, peak_rate=1200)
    morning = bf.rate_at(np.array([3600.0]))[0]
    plateau = bf.rate_at(np.arange(4.5 * 3600, 10.5 * 3600, 60.0))
    burst_window = bf.rate_at(np.arange(3.5 * 3600, 4.5 * 3600, 10.0))
    assert 2.5 < plateau.mean() / morning < 3.5
    assert burst_window.max() == pytest.approx(1200) and burst_window.min() < 1000


def test_a_bad_profile_file_names_the_key_the_value_and_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(
        "segments:\n  - {duration: 10s, rate: -5}\n  - {duration: 1m, shape: ramp, rate: 1}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_profile(str(path))
    text = str(caught.value)
    assert str(path) in text
    assert "segments.0.rate" in text and "-5" in text and "greater than or equal to 0" in text
    assert "segments.1" in text and "needs 'to'" in text


def test_an_unknown_profile_lists_the_built_in_ones() -> None:
    with pytest.raises(ConfigError, match=r"neither a built-in profile .*steady, ramp"):
        load_profile("no-such-profile")


def test_a_custom_profile_with_a_mix(tmp_path: Path) -> None:
    path = tmp_path / "mine.yaml"
    path.write_text(
        "arrivals: constant\n"
        "segments:\n  - {duration: 10s, rate: 50}\n"
        "mix:\n  - {weight: 3, tag: standard}\n"
        "  - {weight: 1, tag: premium, tenant: acme, batch: 4}\n"
    )
    profile = load_profile(str(path))
    schedule = make_schedule(profile, seed=1)
    assert len(schedule) == 500
    share = float((schedule.classes == 1).mean())
    assert 0.2 < share < 0.3
    assert [c.label for c in profile.mix] == ["standard", "premium"]


def test_poisson_and_constant_schedules_follow_the_rate() -> None:
    ramp = load_profile("ramp").scaled(duration=100, peak_rate=200)
    for arrivals in ("poisson", "constant"):
        profile = ramp.model_copy(update={"arrivals": arrivals})
        schedule = make_schedule(profile, seed=3)
        rates = profile.rate_at(np.linspace(0, 100, 10_001))
        # The trapezoid rule by hand: np.trapezoid is numpy 2's (sordino takes 1.26 too).
        expected = float((rates[1:] + rates[:-1]).sum() * 0.01 / 2)
        assert len(schedule) == pytest.approx(expected, rel=0.03)
        first, last = schedule.intended_rate(10.0)[[0, 8]]
        assert first < 40 and last > 150  # the climb shows
        assert np.all(np.diff(schedule.times) >= 0)


def test_payloads_decode_as_kserve_binary_requests() -> None:
    inputs = [InputSpec("pixels", "FP32", (-1, 64)), InputSpec("text", "BYTES", (-1, 1))]
    (payload, *_) = build_payloads(inputs, rows=3)
    headers = {k.lower(): v for k, v in payload.headers.items()}
    header_length = int(headers["inference-header-content-length"])
    request = decode_infer_request(
        payload.body, model="m", version=None, header_length=header_length
    )
    assert request.inputs["pixels"].shape == (3, 64) and request.inputs["text"].shape == (3, 1)


def test_perf_analyzer_input_data(tmp_path: Path) -> None:
    inputs = [InputSpec("INPUT", "FP32", (-1, 4))]
    path = tmp_path / "data.json"
    path.write_text(
        json.dumps(
            {
                "data": [
                    {"INPUT": [1, 2, 3, 4, 5, 6, 7, 8]},
                    {"INPUT": {"content": [1, 2, 3, 4], "shape": [1, 4]}},
                ]
            }
        )
    )
    entries = read_data_file(path, inputs)
    assert entries[0]["INPUT"].shape == (2, 4) and entries[1]["INPUT"].shape == (1, 4)
    assert len(build_payloads(inputs, 1, data=entries)) == 2
    path.write_text(json.dumps({"data": [{"OTHER": [1]}]}))
    with pytest.raises(ConfigError, match="does not have: OTHER"):
        read_data_file(path, inputs)


def test_conditions_parse_and_refuse_clearly() -> None:
    (slo,) = parse_conditions("premium:p99<3s", option="--slo", op="<")
    assert (slo.selector, slo.metric, slo.value) == ("premium", "p99", 3000.0)
    fail = parse_conditions("p99.9>250ms, errors>1%", option="--fail-on", op=">")
    assert [(c.metric, c.value) for c in fail] == [("p99.9", 250.0), ("errors", 0.01)]
    with pytest.raises(ConfigError, match="must use '>'"):
        parse_conditions("p99<3s", option="--fail-on", op=">")
    with pytest.raises(ConfigError, match="not a condition"):
        parse_conditions("latency is bad", option="--slo", op="<")


def test_recorder_percentiles_come_from_the_hdr_histogram() -> None:
    recorder = Recorder(window_s=1.0, windows=2)
    for i in range(1000):
        recorder.record(0.5, (i + 1) / 1000, "ok", [("class", "a")])
    recorder.record(1.5, 0.1, "503", [("class", "a")])
    summary = recorder.summary(("class", "a"))
    assert summary.count == 1000 and summary.errors == 1
    assert summary.p50_ms == pytest.approx(500, rel=0.01)
    assert summary.p99_ms == pytest.approx(990, rel=0.01)
    assert summary.max_ms == pytest.approx(1000, rel=0.01)
    assert recorder.window_errors[1] == {"503": 1}
