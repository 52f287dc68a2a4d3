"""One bad request never fails the requests it would have shared a batch with.

The drill: 5 % of the requests to ``text-normalizer`` carried a BYTES element that is
not UTF-8; the model raised on each batch holding one, and every valid request in
those batches got a 500. Now the offender is refused alone, with a 400 that names the
element, and every valid request is answered.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from sordino.testing import RunningServer, serve_in_thread

URL = "/v2/models/text-normalizer/infer"


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    with serve_in_thread() as running:
        yield running


def _body(text: bytes) -> tuple[bytes, dict[str, str]]:
    data = struct.pack("<I", len(text)) + text
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "text",
                    "datatype": "BYTES",
                    "shape": [1, 1],
                    "parameters": {"binary_data_size": len(data)},
                }
            ]
        }
    )
    return header + data, {"Inference-Header-Content-Length": str(len(header))}


def test_invalid_utf8_is_refused_alone_under_concurrent_load(server: RunningServer) -> None:
    texts = [b"\xff\xfeBAD" if i % 20 == 7 else f"Hello {i}".encode() for i in range(200)]

    def send(text: bytes) -> tuple[int, dict[str, object]]:
        body, headers = _body(text)
        with httpx.Client(base_url=server.url, timeout=30) as client:
            response = client.post(URL, content=body, headers=headers)
            return response.status_code, response.json()

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(send, texts))
    for text, (status, document) in zip(texts, results, strict=True):
        if text.startswith(b"\xff"):
            assert status == 400, document
            assert "not valid UTF-8" in str(document["error"])
        else:
            assert status == 200, document
            (output,) = document["outputs"]  # type: ignore[misc]
            assert output["data"] == [text.decode().lower()]
    stats = server.runtime.get("text-normalizer").scheduler.statistics()
    assert stats.failed == 0
