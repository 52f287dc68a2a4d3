"""Every kind of bad input gets a clear 4xx naming the problem, and the server keeps serving."""

from __future__ import annotations

import json
import logging

import httpx
import pytest

from sordino.testing import RunningServer

PIXELS = {"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [1.0] * 64}


def _binary(
    header: dict, payload: bytes, declared: int | None = None
) -> tuple[bytes, dict[str, str]]:
    raw = json.dumps(header).encode()
    length = len(raw) if declared is None else declared
    return raw + payload, {"Inference-Header-Content-Length": str(length)}


CASES: list[tuple[str, str, dict[str, object], int, str]] = [
    ("malformed JSON", "digits-classifier", {"content": b"{not json"}, 400, "JSON"),
    ("JSON not an object", "digits-classifier", {"content": b"[1, 2]"}, 400, "object"),
    ("missing inputs", "digits-classifier", {"json": {"outputs": []}}, 400, "inputs"),
    ("unknown model", "no-such-model", {"json": {"inputs": [PIXELS]}}, 404, "no-such-model"),
    # The unknown model wins over what is wrong with the body, as in Triton.
    ("unknown model, empty body", "no-such-model", {"json": {}}, 404, "no-such-model"),
    ("unknown model, not JSON", "no-such-model", {"content": b"{not json"}, 404, "no-such-model"),
    ("unknown version, empty body", "digits-classifier/versions/9", {"json": {}}, 404, "version"),
    (
        "unknown version",
        "digits-classifier/versions/9",
        {"json": {"inputs": [PIXELS]}},
        404,
        "version",
    ),
    (
        "unknown input",
        "digits-classifier",
        {"json": {"inputs": [{**PIXELS, "name": "pixelz"}]}},
        400,
        "pixelz",
    ),
    (
        "unknown output",
        "digits-classifier",
        {"json": {"inputs": [PIXELS], "outputs": [{"name": "logits"}]}},
        400,
        "logits",
    ),
    (
        "wrong datatype",
        "digits-classifier",
        {"json": {"inputs": [{**PIXELS, "datatype": "INT32", "data": [1] * 64}]}},
        400,
        "FP32",
    ),
    (
        "unknown datatype",
        "digits-classifier",
        {"json": {"inputs": [{**PIXELS, "datatype": "FLOAT"}]}},
        400,
        "FLOAT",
    ),
    (
        "wrong shape",
        "digits-classifier",
        {"json": {"inputs": [{**PIXELS, "shape": [1, 63], "data": [1.0] * 63}]}},
        400,
        "64",
    ),
    (
        "element count mismatch",
        "digits-classifier",
        {"json": {"inputs": [{**PIXELS, "data": [1.0] * 10}]}},
        400,
        "10",
    ),
    (
        "string in numeric slot",
        "digits-classifier",
        {"json": {"inputs": [{**PIXELS, "data": ["x"] * 64}]}},
        400,
        "pixels",
    ),
    (
        "BYTES tensor in numeric slot",
        "digits-classifier",
        {"json": {"inputs": [{**PIXELS, "datatype": "BYTES", "data": ["a"] * 64}]}},
        400,
        "BYTES",
    ),
    (
        "number in BYTES slot",
        "text-normalizer",
        {"json": {"inputs": [{"name": "text", "shape": [1, 1], "datatype": "BYTES", "data": [5]}]}},
        400,
        "text",
    ),
    (
        "batch over max_batch_size",
        "digits-classifier",
        {"json": {"inputs": [{**PIXELS, "shape": [65, 64], "data": [1.0] * 65 * 64}]}},
        400,
        "64",
    ),
    (
        "bad priority",
        "digits-classifier",
        {"json": {"inputs": [PIXELS], "parameters": {"priority": 7}}},
        400,
        "priority",
    ),
    (
        "sequence batching asked for",
        "digits-classifier",
        {"json": {"inputs": [PIXELS], "parameters": {"sequence_id": 3}}},
        400,
        "sequence",
    ),
]


@pytest.mark.parametrize(
    ("label", "model", "kwargs", "status", "needle"), CASES, ids=[c[0] for c in CASES]
)
def test_bad_input_gets_clear_4xx(
    server: RunningServer,
    caplog: pytest.LogCaptureFixture,
    label: str,
    model: str,
    kwargs: dict[str, object],
    status: int,
    needle: str,
) -> None:
    with caplog.at_level(logging.ERROR, logger="sordino"), httpx.Client(base_url=server.url) as c:
        response = c.post(f"/v2/models/{model}/infer", **kwargs)  # type: ignore[arg-type]
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert needle.lower() in error.lower(), error
        valid = c.post("/v2/models/digits-classifier/infer", json={"inputs": [PIXELS]})
        assert valid.status_code == 200
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_binary_header_length_larger_than_body(server: RunningServer) -> None:
    body, headers = _binary({"inputs": []}, b"", declared=10_000)
    with httpx.Client(base_url=server.url) as c:
        r = c.post("/v2/models/digits-classifier/infer", content=body, headers=headers)
    assert r.status_code == 400
    assert "Inference-Header-Content-Length" in r.json()["error"]


def test_binary_size_not_matching_body(server: RunningServer) -> None:
    header = {"inputs": [{**PIXELS, "data": None, "parameters": {"binary_data_size": 256}}]}
    del header["inputs"][0]["data"]
    body, headers = _binary(header, b"\0" * 100)
    with httpx.Client(base_url=server.url) as c:
        r = c.post("/v2/models/digits-classifier/infer", content=body, headers=headers)
    assert r.status_code == 400
    assert "256" in r.json()["error"] or "100" in r.json()["error"]


def test_non_numeric_header_length(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url) as c:
        r = c.post(
            "/v2/models/digits-classifier/infer",
            content=b"{}",
            headers={"Inference-Header-Content-Length": "abc"},
        )
    assert r.status_code == 400


def test_unknown_route_is_json_404(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url) as c:
        r = c.get("/v2/nothing/here")
    assert r.status_code == 404
    assert "error" in r.json()


def test_wrong_method_is_405(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url) as c:
        r = c.get("/v2/models/digits-classifier/infer")
    assert r.status_code == 405
    assert "GET" in r.json()["error"]
