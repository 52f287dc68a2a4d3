"""The pure parts of bench/bench_overload.py and its C floor, bench/refuser.c.

The benchmark itself (a pinned server at three times its capacity) is run by hand; here
the request bytes it sends, the per-second timeline it reports and the refuser it
measures the floor with are checked.
"""

from __future__ import annotations

import shutil
import socket
import time
from pathlib import Path

import numpy as np
import orjson
import pytest
from bench.bench_overload import WORKLOADS, Outcomes, request_bytes, timeline

from bench import bench_overload, common


def _split(request: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    head, _, body = request.partition(b"\r\n\r\n")
    line, *fields = head.split(b"\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (f.partition(b":") for f in fields)}
    return line, headers, body


@pytest.mark.parametrize("where", ["headers", "body"])
def test_w2_requests_are_binary_with_the_priority_and_deadline_where_asked(where: str) -> None:
    request = request_bytes(WORKLOADS["w2"], "127.0.0.1:1", "high", 500_000, where)
    line, headers, body = _split(request)
    assert line == b"POST /v2/models/w2/infer HTTP/1.1"
    assert int(headers[b"content-length"]) == len(body)
    json_length = int(headers[b"inference-header-content-length"])
    document = orjson.loads(body[:json_length])
    (tensor,) = document["inputs"]
    assert tensor["shape"] == [1, 3, 64, 64]
    assert tensor["parameters"]["binary_data_size"] == len(body) - json_length == 3 * 64 * 64 * 4
    if where == "headers":
        assert headers[b"x-sordino-priority"] == b"high"
        assert headers[b"x-sordino-timeout"] == b"500000"
        assert "priority" not in document["parameters"]
    else:
        assert b"x-sordino-priority" not in headers
        assert document["parameters"]["priority"] == "high"
        assert document["parameters"]["timeout"] == 500_000


def test_digits_requests_are_json() -> None:
    _, headers, body = _split(request_bytes(WORKLOADS["digits"], "h", "low", None, "body"))
    document = orjson.loads(body)
    assert document["inputs"][0]["data"] == [0.5] * 64
    assert document["parameters"] == {"priority": "low"}
    assert b"x-sordino-timeout" not in headers


def test_the_timeline_counts_each_second_of_the_schedule() -> None:
    # 4 requests a second for 2 s: second 0 has two good answers, one refusal within
    # 5 ms and one slow one; second 1 a late 200, a connection error and two highs.
    status = np.array([200, 200, 503, 503, 200, 0, 200, 200])
    latency = np.array([0.01, 0.02, 0.001, 0.3, 0.9, np.nan, 0.05, 0.07])
    high = np.array([True, False, False, False, False, False, True, True])
    series = timeline(Outcomes(high, status, latency, 4.0), rate=4.0, deadline_s=0.5)
    assert series["goodput"] == [2, 2]
    assert series["refused"] == [2, 0]
    assert series["refused_slow"] == [1, 0]
    assert series["high_p99_ms"][0] == pytest.approx(10.0)
    assert series["high_p99_ms"][1] == pytest.approx(np.percentile([50.0, 70.0], 99))


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no gcc")
def test_the_refuser_answers_each_request_and_skips_bodies_split_across_reads(
    tmp_path: Path,
) -> None:
    refuser = bench_overload.Refuser(tmp_path, cpu=None)
    try:
        port = int(refuser.url.rsplit(":", 1)[1])
        body = b"x" * 100_000
        request = b"POST /a HTTP/1.1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            # Two requests, cut at odd places (inside the headers and inside a body).
            stream = request + request
            pieces = [stream[:20], stream[20:5_000], stream[5_000:130_000], stream[130_000:]]
            for piece in pieces:
                conn.sendall(piece)
                time.sleep(0.05)  # read apart, most likely: the refuser must carry state
            answers = b""
            while answers.count(b"HTTP/1.1 503") < 2 or not answers.endswith(b"}"):
                chunk = conn.recv(65536)
                assert chunk, "the refuser closed the connection"
                answers += chunk
        assert answers.count(b"HTTP/1.1 503 Service Unavailable") == 2
        for answer in answers.split(b"HTTP/1.1 ")[1:]:
            _, headers, payload = _split(b"HTTP/1.1 " + answer)
            assert int(headers[b"content-length"]) == len(payload)
            assert headers[b"retry-after"] == b"1"
            assert orjson.loads(payload)["error"]
    finally:
        refuser.close()
    assert refuser.proc.returncode is not None


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None, reason="no gcc")
def test_without_lows_the_generator_sends_the_same_schedules_high_priority_requests(
    tmp_path: Path,
) -> None:
    # The "high priority alone" phase: the overload's own arrivals, its low ones unsent.
    refuser = bench_overload.Refuser(tmp_path, cpu=None)
    generator = bench_overload.Generator(refuser.url, None, WORKLOADS["digits"])
    try:
        both = generator.open(400, 1.0, deadline_us=None, where="headers", connections=8)
        alone = generator.open(
            400, 1.0, deadline_us=None, where="headers", connections=8, lows=False
        )
    finally:
        generator.close()
        refuser.close()
    assert both.status.size == 400 and (both.status == 503).all()
    assert 40 < both.high.sum() < 120  # a fifth, drawn
    # Exactly the high-priority requests of the same draw, each answered.
    assert alone.high.all() and alone.status.size == both.high.sum()
    assert (alone.status == 503).all()
    # The unsent low ones are not counted as sent (were they, the two rates would match).
    assert 0.1 < alone.sent_per_s / both.sent_per_s < 0.4


def test_other_processes_share_is_the_core_busy_time_the_server_and_workers_did_not_use(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a shared machine the report says how much of the server's core others took."""
    monkeypatch.setattr(common, "core_busy_s", lambda core: 17.0)
    before = {"server": 1.0, "workers": 2.0, "client": 0.0}
    after = {"server": 4.0, "workers": 3.0, "client": 9.0}
    # 7 s busy in 10 s, of which the server 3 s and the workers 1 s: others took 0.3.
    assert common.others_share(1, 10.0, before, after, 10.0) == pytest.approx(0.3)
    assert common.others_share(None, 10.0, before, after, 10.0) == 0.0


def test_a_core_s_busy_time_is_read_from_proc_stat() -> None:
    """The counter grows and is never negative (0 where the core is not known)."""
    first = common.core_busy_s(0)
    assert first >= 0.0
    assert common.core_busy_s(None) == 0.0
    assert common.core_busy_s(10_000) == 0.0
