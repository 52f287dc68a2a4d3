"""Triton's generate extension over HTTP: flat JSON, and Server-Sent Events for streams."""

from __future__ import annotations

import json

import httpx

from sordino.testing import RunningServer


def _events(text: str) -> list[dict[str, object]]:
    return [json.loads(line[len("data: ") :]) for line in text.splitlines() if line.strip()]


def test_generate_stream_sends_one_event_per_step(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.post(
            "/v2/models/countdown/generate_stream", json={"COUNT": 3, "id": "g1"}
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = _events(response.text)
    assert [(e["REMAINING"], e["DONE"]) for e in events] == [(2, False), (1, False), (0, True)]
    assert all(e["id"] == "g1" and e["model_name"] == "countdown" for e in events)


def test_generate_on_a_one_shot_model(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        text = client.post("/v2/models/text-normalizer/generate", json={"text": "Hello WORLD"})
        simple = client.post(
            "/v2/models/simple/versions/1/generate",
            json={"INPUT0": list(range(16)), "INPUT1": [1] * 16},
        )
        streamed = client.post("/v2/models/text-normalizer/generate_stream", json={"text": "ABC"})
    assert text.status_code == 200, text.text
    assert text.json()["normalized"] == "hello world"
    assert simple.json()["OUTPUT0"] == list(range(1, 17))
    assert _events(streamed.text) == [
        {"model_name": "text-normalizer", "model_version": "1", "normalized": "abc"}
    ]


def test_generate_errors_are_statuses(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        unknown_input = client.post("/v2/models/countdown/generate_stream", json={"COUNTS": 3})
        unknown_model = client.post("/v2/models/nope/generate", json={"x": 1})
        streaming_only = client.post("/v2/models/countdown/generate", json={"COUNT": 1})
        not_json = client.post("/v2/models/countdown/generate_stream", content=b"{oops")
    assert unknown_input.status_code == 400 and "COUNTS" in unknown_input.json()["error"]
    assert unknown_model.status_code == 404
    assert streaming_only.status_code == 400
    assert "generate_stream" in streaming_only.json()["error"]
    assert not_json.status_code == 400


def test_repository_endpoints_refuse_without_model_control(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:
        index = client.post("/v2/repository/index", json={"ready": True})
        load = client.post("/v2/repository/models/simple/load")
    assert index.status_code == 200
    assert {e["name"] for e in index.json()} >= {"simple", "countdown"}
    assert load.status_code == 400 and "explicit" in load.json()["error"]


def test_a_prompt_past_the_limit_is_refused_naming_it(server: RunningServer) -> None:
    """A megabyte prompt would stall the event loop in the prompt parser: refused first."""
    prompt = "a handwritten 7 " + "x" * 1_000_000
    with httpx.Client(base_url=server.url, timeout=30) as client:
        response = client.post("/v2/models/digits-diffusion/generate", json={"prompt": prompt})
        served = client.post(
            "/v2/models/digits-diffusion/generate", json={"prompt": "a handwritten 7", "steps": 2}
        )
    assert response.status_code == 400
    message = response.json()["error"]
    assert "iterative.max_prompt_length" in message and "1024" in message
    assert served.status_code == 200, served.text
