"""Compressed inference over HTTP (``server/http_coding.py``): tritonclient's
``request_compression_algorithm`` and ``response_compression_algorithm`` against a real
server, in its own process and behind a front-end process, and the refusals."""

from __future__ import annotations

import gzip
import http.client
import json
import zlib
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from sordino.config import RuntimeConfig
from sordino.errors import MalformedBody, Unsupported
from sordino.models.repository import builtin_sources
from sordino.server.http_coding import accepted, inflate
from sordino.testing import RunningServer, serve_in_thread
from tests.conftest import thread_isolated
from tests.server.frontend_helpers import connection_on
from tests.server.helpers import frontend_pid

BODY = json.dumps(
    {
        "inputs": [
            {"name": name, "shape": [1, 16], "datatype": "INT32", "data": list(range(16))}
            for name in ("INPUT0", "INPUT1")
        ]
    }
).encode()


def _serving(frontends: int) -> Iterator[RunningServer]:
    server_config = RuntimeConfig().server.model_copy(
        update={"frontends": frontends, "max_request_size": 1 << 20}
    )
    config = RuntimeConfig().model_copy(update={"server": server_config})
    with serve_in_thread(config, thread_isolated(builtin_sources())) as running:
        yield running


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    """One server process: its own HTTP protocol decodes and encodes."""
    yield from _serving(1)


@pytest.fixture(scope="module")
def fronted() -> Iterator[RunningServer]:
    """A server with two front-end processes, which decode and encode themselves."""
    yield from _serving(2)


@pytest.mark.parametrize("request_coding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_coding", [None, "gzip", "deflate"])
@pytest.mark.parametrize("binary", [False, True])
def test_tritonclient_compression_round_trips(
    server: RunningServer, request_coding: str | None, response_coding: str | None, binary: bool
) -> None:
    client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(16, dtype=np.int32).reshape(1, 16), binary_data=binary)
        inputs.append(tensor)
    result = client.infer(
        "simple",
        inputs,
        request_compression_algorithm=request_coding,
        response_compression_algorithm=response_coding,
    )
    assert list(result.as_numpy("OUTPUT0").reshape(-1)) == [2 * i for i in range(16)]
    client.close()


def _post(
    connection: http.client.HTTPConnection, body: bytes, **headers: str
) -> tuple[int, bytes, dict[str, str]]:
    connection.request("POST", "/v2/models/simple/infer", body, headers)
    answer = connection.getresponse()
    return answer.status, answer.read(), {k.lower(): v for k, v in answer.getheaders()}


@pytest.mark.parametrize("where", ["server", "front end"])
def test_both_processes_inflate_and_compress(
    server: RunningServer, fronted: RunningServer, where: str
) -> None:
    if where == "server":
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    else:
        connection = connection_on(fronted, frontend_pid(fronted))
    status, payload, headers = _post(
        connection,
        gzip.compress(BODY),
        **{"Content-Encoding": "gzip", "Accept-Encoding": "deflate"},
    )
    assert status == 200, payload
    assert headers["content-encoding"] == "deflate"
    outputs = {o["name"]: o["data"] for o in json.loads(zlib.decompress(payload))["outputs"]}
    assert outputs["OUTPUT1"] == [0] * 16
    # Nothing asked: the answer as it is.
    status, payload, headers = _post(connection, BODY)
    assert status == 200 and "content-encoding" not in headers
    json.loads(payload)
    # Errors are not compressed, and say what to fix.
    status, payload, headers = _post(
        connection, b"not gzip", **{"Content-Encoding": "gzip", "Accept-Encoding": "gzip"}
    )
    assert status == 400 and "content-encoding" not in headers
    assert "is not gzip data" in json.loads(payload)["error"]
    status, payload, _ = _post(connection, BODY, **{"Content-Encoding": "br"})
    assert status == 400
    assert "Content-Encoding 'br' is not supported" in json.loads(payload)["error"]
    # A body that inflates past server.max_request_size is 413, as a plain one that large.
    bomb = gzip.compress(b" " * (2 << 20))
    status, payload, _ = _post(connection, bomb, **{"Content-Encoding": "gzip"})
    assert status == 413
    assert "inflates past the limit" in json.loads(payload)["error"]
    connection.close()


def test_inflate_takes_the_codings_clients_send() -> None:
    assert inflate(zlib.compress(BODY), "deflate", 1 << 20) == BODY
    raw = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    assert inflate(raw.compress(BODY) + raw.flush(), "deflate", 1 << 20) == BODY
    assert inflate(gzip.compress(BODY), "X-GZIP", 1 << 20) == BODY
    assert inflate(BODY, "identity", 1 << 20) == BODY
    with pytest.raises(MalformedBody, match="is not gzip data"):
        inflate(gzip.compress(BODY)[:-10], "gzip", 1 << 20)  # truncated
    with pytest.raises(Unsupported, match="'compress' is not supported"):
        inflate(BODY, "compress", 1 << 20)
    # A gzip body of several members (RFC 1952) is all of them; bytes after a deflate
    # stream are refused, as is a second member that inflates past the limit.
    half = len(BODY) // 2
    members = gzip.compress(BODY[:half]) + gzip.compress(BODY[half:])
    assert inflate(members, "gzip", 1 << 20) == BODY
    with pytest.raises(MalformedBody, match="is not deflate data"):
        inflate(zlib.compress(BODY) + b"more", "deflate", 1 << 20)
    with pytest.raises(MalformedBody, match="inflates past the limit"):
        inflate(members + gzip.compress(b" " * 300), "gzip", len(BODY) + 100)


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        ("gzip", "gzip"),
        ("GZIP", "gzip"),
        ("deflate, gzip", "deflate"),
        ("gzip;q=0, deflate", "deflate"),
        ("deflate;q=0.5, gzip", "gzip"),
        ("x-gzip", "gzip"),
        ("br, identity", None),
        ("gzip;q=0", None),
        ("gzip;q=nope", None),
        ("*", None),
    ],
)
def test_accept_encoding_picks_the_coding(accept: str, coding: str | None) -> None:
    assert accepted(accept) == coding
