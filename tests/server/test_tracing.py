"""Triton's trace extension: sampled requests' timestamps in a trace file, and the
settings read and changed over HTTP and gRPC as Triton 2.51 answers them (the parity
bench compares both servers' answers side by side)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from click.testing import CliRunner

from sordino.cli.start import start
from sordino.config import RuntimeConfig
from sordino.config.trace import TraceConfig
from sordino.errors import InvalidRequest, Unsupported
from sordino.models.repository import builtin_sources
from sordino.server import tracing
from sordino.server.tracing import Tracer
from sordino.testing import serve_in_thread
from tests.conftest import thread_isolated

ENGINE = [
    "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "INFER_RESPONSE_COMPLETE",
]  # fmt: skip
"""The timestamps of every traced request, in the order they happen."""

TRITON_DEFAULTS = {
    "trace_level": ["OFF"],
    "trace_rate": "1000",
    "trace_count": "-1",
    "log_frequency": "0",
    "trace_file": "",
    "trace_mode": "triton",
}
"""Triton 2.51's answer to GET /v2/trace/setting, started with no --trace-config."""


def _simple(client: Any, mod: Any, request_id: str) -> None:
    a = np.ones((1, 16), dtype=np.int32)
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = mod.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(a)
        inputs.append(tensor)
    client.infer("simple", inputs, request_id=request_id)


def _traces(path: Path) -> dict[int, dict[str, Any]]:
    """A trace file's records joined by trace id: the request's fields, and its
    timestamps in the order the file lists them."""
    found: dict[int, dict[str, Any]] = {}
    for record in orjson.loads(path.read_bytes()):
        trace = found.setdefault(record["id"], {"stamps": []})
        if "timestamps" in record:
            trace["stamps"] += [(t["name"], t["ns"]) for t in record["timestamps"]]
        else:
            trace.update({k: v for k, v in record.items() if k != "id"})
    return found


def test_every_nth_request_is_traced_until_the_count_with_tritons_timestamps(
    tmp_path: Path,
) -> None:
    """rate 2, count 3, a file every 2 traces: of 8 requests (HTTP then gRPC) the 2nd,
    4th and 6th are traced, into trace.json.0 (two) and, at stop, trace.json.1; each
    has the engine's timestamps in time order between its transport's."""
    path = tmp_path / "trace.json"
    trace = TraceConfig(file=path, level=["TIMESTAMPS"], rate=2, count=3, log_frequency=2)
    config = RuntimeConfig().model_copy(
        update={"server": RuntimeConfig().server.model_copy(update={"trace": trace})}
    )
    with serve_in_thread(config) as server:
        http = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        for index in range(4):
            _simple(http, httpclient, f"h{index}")
        for index in range(4):
            _simple(grpc, grpcclient, f"g{index}")
        assert http.get_trace_settings()["trace_count"] == "0"  # all three taken
        http.close()
        grpc.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json.0", "trace.json.1"]
    first, second = _traces(path.with_name("trace.json.0")), _traces(path.with_name("trace.json.1"))
    assert sorted(first) == [1, 2] and sorted(second) == [3]
    traces = {**first, **second}
    assert [t["request_id"] for _, t in sorted(traces.items())] == ["h1", "h3", "g1"]
    for ident, traced in traces.items():
        assert (traced["model_name"], traced["model_version"]) == ("simple", 1)
        names = [name for name, _ in traced["stamps"]]
        moments = dict(traced["stamps"])
        transport = "HTTP" if ident < 3 else "GRPC"
        expected = (
            ["HTTP_RECV_START", "HTTP_RECV_END", *ENGINE, "HTTP_SEND_START", "HTTP_SEND_END"]
            if transport == "HTTP"
            else [*ENGINE, "GRPC_SEND_START", "GRPC_SEND_END"]
        )
        assert sorted(names) == sorted(expected)
        in_time = [moments[name] for name in expected]
        assert in_time == sorted(in_time), names


def test_settings_are_read_and_changed_as_on_triton(tmp_path: Path) -> None:
    """The server's settings and a model's own (null: the server's again), over HTTP
    and gRPC; what Triton refuses, refused with what to give."""
    path = tmp_path / "trace.json"
    config = RuntimeConfig().model_copy(
        update={
            "server": RuntimeConfig().server.model_copy(update={"trace": TraceConfig(file=path)})
        }
    )
    with serve_in_thread(config) as server:
        url = server.url
        assert httpx.get(f"{url}/v2/trace/setting").json() == {
            **TRITON_DEFAULTS,
            "trace_file": str(path),
        }
        assert "trace" in httpx.get(f"{url}/v2").json()["extensions"]
        changed = httpx.post(f"{url}/v2/models/simple/trace/setting", json={"trace_rate": "2"})
        assert changed.json()["trace_rate"] == "2"
        # The server's change reaches a model in what it did not set itself.
        on = {"trace_level": ["TIMESTAMPS"], "trace_rate": "5"}
        assert httpx.post(f"{url}/v2/trace/setting", json=on).status_code == 200
        own = httpx.get(f"{url}/v2/models/simple/trace/setting").json()
        assert (own["trace_level"], own["trace_rate"]) == (["TIMESTAMPS"], "2")
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        answer = grpc.update_trace_settings(
            model_name="simple", settings={"trace_rate": None}, as_json=True
        )
        assert answer["settings"]["trace_rate"]["value"] == ["5"]
        assert grpc.get_trace_settings(as_json=True)["settings"]["trace_level"]["value"] == [
            "TIMESTAMPS"
        ]
        grpc.close()
        refused = [
            ("/v2/trace/setting", {"trace_file": "/tmp/elsewhere.json"}, 400, "network protocol"),
            ("/v2/trace/setting", {"trace_rate": "0"}, 400, "trace_rate must be"),
            ("/v2/trace/setting", {"trace_rate": "abc"}, 400, "trace_rate must be"),
            ("/v2/trace/setting", {"trace_count": "0"}, 400, "-1 for no limit"),
            ("/v2/trace/setting", {"trace_level": "TIMESTAMPS"}, 400, "must be a list"),
            ("/v2/trace/setting", {"trace_level": ["TENSORS"]}, 400, "TENSORS is not supported"),
            ("/v2/trace/setting", {"trace_mode": "opentelemetry"}, 400, "not supported"),
            ("/v2/trace/setting", {"bogus": "1"}, 400, "unknown trace setting 'bogus'"),
            ("/v2/models/nope/trace/setting", {"trace_rate": "1"}, 400, "unknown model 'nope'"),
        ]
        for where, body, status, said in refused:
            answer = httpx.post(f"{url}{where}", json=body)
            assert (answer.status_code, said in answer.json()["error"]) == (status, True), body
        assert httpx.get(f"{url}/v2/trace/setting").json()["trace_rate"] == "5"  # unchanged


def test_without_a_file_timestamps_are_refused() -> None:
    """As Triton: no trace file given at start, no tracing can be switched on."""
    tracer = Tracer(TraceConfig(), lambda name: True)
    with pytest.raises(InvalidRequest, match="trace file name is not given"):
        tracer.update({"trace_level": ["TIMESTAMPS"]})
    assert tracer.update({"trace_rate": "10"})["trace_rate"] == "10"
    for model in (None, "m"):  # the one mode there is, named: nothing to change
        assert tracer.update({"trace_mode": "triton"}, model)["trace_mode"] == "triton"
        assert tracer.update({"trace_mode": None}, model)["trace_rate"] == "10"
    with pytest.raises(Unsupported, match="TENSORS"):
        tracer.update({"trace_level": ["TENSORS"]})
    assert not tracer.on


def test_a_log_frequency_of_zero_writes_one_file_at_stop(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    tracer = Tracer(TraceConfig(file=path, level=["TIMESTAMPS"], rate=1), lambda name: True)
    for index in range(3):
        trace = tracer.sample("m", "1", f"r{index}")
        assert trace is not None
        trace.stamp("REQUEST_START")
        trace.collect()
    assert not path.exists()
    tracer.close()
    assert [t["request_id"] for t in _traces(path).values()] == ["r0", "r1", "r2"]


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--trace-config", "level=TIMESTAMPS"], "level TIMESTAMPS needs a trace file"),
        (["--trace-config", "opentelemetry,url=http://x"], "only Triton's triton trace mode"),
        (["--trace-config", "level=TENSORS"], "TENSORS is not supported"),
        (["--trace-config", "triton,size=3"], "the settings are triton,file=PATH"),
        (["--trace-config", "rate"], "give [triton,]SETTING=VALUE"),
        (["--trace-config", "triton,file=/nonexistent/sordino/t.json"], "does not exist"),
    ],
)
def test_bad_trace_flags_stop_start_with_what_to_give(flags: list[str], said: str) -> None:
    result = CliRunner().invoke(start, ["--http-port", "0", "--grpc-port", "0", *flags])
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert "Traceback" not in result.output


def test_behind_front_end_processes_the_engine_traces(tmp_path: Path) -> None:
    """--frontends 2: requests come to the engine over the link (its callback path, which
    tracing turns off); each traced request has the engine's timestamps, in time order."""
    path = tmp_path / "trace.json"
    trace = TraceConfig(file=path, level=["TIMESTAMPS"], rate=1)
    server_config = RuntimeConfig().server.model_copy(update={"trace": trace, "frontends": 2})
    config = RuntimeConfig().model_copy(update={"server": server_config})
    with serve_in_thread(config, thread_isolated(builtin_sources())) as server:
        http = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        for index in range(3):
            _simple(http, httpclient, f"f{index}")
        http.close()
    traces = _traces(path)
    assert sorted(t["request_id"] for t in traces.values()) == ["f0", "f1", "f2"]
    for traced in traces.values():
        moments = dict(traced["stamps"])
        assert sorted(moments) == sorted(ENGINE)
        in_time = [moments[name] for name in ENGINE]
        assert in_time == sorted(in_time)


def test_traces_held_for_the_stop_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """log_frequency 0 keeps traces for the stop, but never more than HELD_AT_MOST: the
    held ones then go to the next numbered file, and the rest to PATH at the stop."""
    monkeypatch.setattr(tracing, "HELD_AT_MOST", 3)
    path = tmp_path / "trace.json"
    tracer = Tracer(TraceConfig(file=path, level=("TIMESTAMPS",), rate=1), lambda name: True)
    for index in range(4):
        trace = tracer.sample("m", "1", f"r{index}")
        assert trace is not None
        trace.collect()
    assert [t["request_id"] for t in _traces(tmp_path / "trace.json.0").values()] == [
        "r0", "r1", "r2"
    ]  # fmt: skip
    tracer.close()
    assert [t["request_id"] for t in _traces(path).values()] == ["r3"]
