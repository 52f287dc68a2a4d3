"""Sequence batching with Triton's simple_sequence example and tritonclient.

The flow of Triton's simple_{http,grpc}_sequence_sync_infer_client and
simple_grpc_sequence_stream_infer_client: two sequences interleaved, each request
flagged start/end, every answer the running sum of its own sequence.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from pydantic import ValidationError
from tritonclient.utils import InferenceServerException

from sordino.config import load_config
from sordino.config.models import ModelConfig
from sordino.config.sequences import SequenceBatchingConfig
from sordino.config.tenants import hash_key
from sordino.models.repository import ModelSource, scan_repository, triton_example_sources
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

VALUES = [11, 7, 5, 3, 2, 0, 1]


def _sequence_source(
    idle_us: int | None = None, *, slots: int = 2, per_client: int | None = 2
) -> Any:
    source = next(s for s in triton_example_sources() if s.name == "simple_sequence")
    if idle_us is None:
        return source
    assert source.config.sequence_batching is not None
    batching = source.config.sequence_batching.model_copy(
        update={"max_sequence_idle_microseconds": idle_us, "direct": None, "oldest": None}
    )
    batching = SequenceBatchingConfig.model_validate(
        {
            **batching.model_dump(),
            "oldest": {"max_candidate_sequences": slots},
            "max_sequences_per_client": per_client,
        }
    )
    config = source.config.model_copy(update={"sequence_batching": batching})
    return type(source)(source.name, source.version, source.path, config)


@pytest.fixture(scope="module")
def sequences() -> Iterator[RunningServer]:
    with serve_in_thread(sources=[_sequence_source()]) as running:
        yield running


@pytest.fixture(params=["http", "grpc"])
def client(sequences: RunningServer, request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "http":
        client: Any = httpclient.InferenceServerClient(url=sequences.url.removeprefix("http://"))
    else:
        client = grpcclient.InferenceServerClient(sequences.grpc_url)
    yield client
    client.close()


def _inputs(mod: Any, value: int) -> list[Any]:
    tensor = mod.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [tensor]


def _send(client: Any, value: int, sequence_id: int | str, *, start: bool, end: bool) -> int:
    mod = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    result = client.infer(
        "simple_sequence",
        _inputs(mod, value),
        outputs=[mod.InferRequestedOutput("OUTPUT")],
        sequence_id=sequence_id,
        sequence_start=start,
        sequence_end=end,
    )
    assert result.as_numpy("STATE_OUT") is None  # the implicit state stays on the server
    return int(result.as_numpy("OUTPUT")[0][0])


@pytest.mark.parametrize("ids", [(1000, 1001), ("seq-a", "seq-b")], ids=["uint64", "string"])
def test_two_interleaved_sequences_accumulate(client: Any, ids: tuple[Any, Any]) -> None:
    first, second = [], []
    for i, value in enumerate(VALUES):
        start, end = i == 0, i == len(VALUES) - 1
        first.append(_send(client, value, ids[0], start=start, end=end))
        second.append(_send(client, -value, ids[1], start=start, end=end))
    assert first == list(np.cumsum(VALUES))
    assert second == list(-np.cumsum(VALUES))


def test_over_the_grpc_stream(sequences: RunningServer) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    client = grpcclient.InferenceServerClient(sequences.grpc_url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for i, value in enumerate(VALUES):
        client.async_stream_infer(
            "simple_sequence", _inputs(grpcclient, value), sequence_id=77,
            sequence_start=i == 0, sequence_end=i == len(VALUES) - 1,
        )  # fmt: skip
    got = []
    for _ in VALUES:
        result, error = answers.get(timeout=30)
        assert error is None, error
        got.append(int(result.as_numpy("OUTPUT")[0][0]))
    client.stop_stream()
    client.close()
    assert got == list(np.cumsum(VALUES))


def test_mistakes_are_explained(client: Any) -> None:
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        _send(client, 1, 4242, start=False, end=False)
    with pytest.raises(InferenceServerException, match="non-zero or non-empty correlation ID"):
        client.infer("simple_sequence", _inputs(_mod(client), 1))


@pytest.mark.parametrize("sequence_id", [-1, -(2**63)])
def test_negative_correlation_ids_are_refused(client: Any, sequence_id: int) -> None:
    with pytest.raises(InferenceServerException, match=r"out of range.*1 to 2\*\*64-1") as info:
        _send(client, 1, sequence_id, start=True, end=False)
    assert info.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")


def _mod(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def test_idle_sequences_are_released_with_an_event_and_slots_are_bounded() -> None:
    with serve_in_thread(sources=[_sequence_source(idle_us=300_000)]) as running:
        client = httpclient.InferenceServerClient(url=running.url.removeprefix("http://"))
        assert _send(client, 5, 1, start=True, end=False) == 5
        assert _send(client, 6, 2, start=True, end=False) == 6
        with pytest.raises(InferenceServerException, match="serves 2 sequences at once"):
            _send(client, 7, 3, start=True, end=False)
        events = running.runtime.events
        wait_for(
            lambda: len(events.recent("sequence_released")) >= 2, "two idle sequences released"
        )
        event = events.recent("sequence_released")[0]
        assert event.subject == "simple_sequence" and event.cause == "idle"
        with pytest.raises(InferenceServerException, match="must specify the START flag"):
            _send(client, 1, 1, start=False, end=False)
        assert _send(client, 7, 3, start=True, end=True) == 7
        client.close()


def test_one_client_cannot_hold_every_slot() -> None:
    # 4 slots, the default share (half): a client's third sequence is refused with 429
    # whatever tenant it claims, and two slots stay free for others.
    source = _sequence_source(idle_us=60_000_000, slots=4, per_client=None)
    with serve_in_thread(sources=[source]) as running:
        client = httpclient.InferenceServerClient(url=running.url.removeprefix("http://"))
        assert _send(client, 5, 1, start=True, end=False) == 5
        assert _send(client, 6, 2, start=True, end=False) == 6
        for headers in (None, {"x-sordino-tenant": "someone-else"}):
            with pytest.raises(InferenceServerException, match="hold 2 of its 4") as info:
                client.infer(
                    "simple_sequence", _inputs(httpclient, 7), sequence_id=3,
                    sequence_start=True, headers=headers,
                )  # fmt: skip
            assert info.value.status() == "429"
        # Its own sequences go on; ending one frees its share.
        assert _send(client, 1, 1, start=False, end=True) == 6
        assert _send(client, 7, 3, start=True, end=False) == 7
        client.close()


ACME, OTHER = "acme-key-0123456789", "other-key-0123456789"


def test_a_tenant_holds_its_share_and_another_tenant_still_starts() -> None:
    config = load_config(
        None,
        {
            "tenants": [
                {"name": "acme", "keys": [hash_key(ACME)]},
                {"name": "other", "keys": [hash_key(OTHER)]},
            ],
        },
    )
    source = _sequence_source(idle_us=60_000_000, slots=3, per_client=1)
    with serve_in_thread(config, sources=[source]) as running:
        client = grpcclient.InferenceServerClient(running.grpc_url)
        acme = {"authorization": f"Bearer {ACME}"}
        other = {"authorization": f"Bearer {OTHER}"}

        def start(headers: dict[str, str], corrid: int) -> int:
            result = client.infer(
                "simple_sequence", _inputs(grpcclient, corrid), sequence_id=corrid,
                sequence_start=True, headers=headers,
            )  # fmt: skip
            return int(result.as_numpy("OUTPUT")[0][0])

        assert start(acme, 1) == 1
        with pytest.raises(InferenceServerException, match="hold 1 of its 3"):
            start(acme, 2)
        assert start(other, 2) == 2
        client.close()


def test_a_sequence_whose_requests_fail_is_still_released_when_idle() -> None:
    with serve_in_thread(sources=[_sequence_source(idle_us=300_000)]) as running:
        client = httpclient.InferenceServerClient(url=running.url.removeprefix("http://"))
        for corrid in (1, 2):  # both slots taken by starts that fail (a hidden input sent)
            bad = [*_inputs(httpclient, 1), httpclient.InferInput("START", [1, 1], "INT32")]
            bad[1].set_data_from_numpy(np.array([[1]], dtype=np.int32))
            with pytest.raises(InferenceServerException, match="filled in by the sequence"):
                client.infer("simple_sequence", bad, sequence_id=corrid, sequence_start=True)
        events = running.runtime.events
        wait_for(lambda: len(events.recent("sequence_released")) >= 2, "failed sequences released")
        assert _send(client, 7, 3, start=True, end=True) == 7
        client.close()


def _corrid_model(tmp_path: Path, datatype: int, name: str) -> Any:
    """A model that answers its CORRID control input (so the test sees what was filled)."""
    inputs = [
        helper.make_tensor_value_info("INPUT", TensorProto.INT32, ["batch", 1]),
        helper.make_tensor_value_info("CORRID", datatype, ["batch", 1]),
        helper.make_tensor_value_info("END", TensorProto.BOOL, ["batch", 1]),
    ]
    outputs = [
        helper.make_tensor_value_info("ID", datatype, ["batch", 1]),
        helper.make_tensor_value_info("LAST", TensorProto.BOOL, ["batch", 1]),
    ]
    nodes = [
        helper.make_node("Identity", ["CORRID"], ["ID"]),
        helper.make_node("Identity", ["END"], ["LAST"]),
    ]
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    kind = "TYPE_STRING" if datatype == TensorProto.STRING else "TYPE_UINT64"
    config = ModelConfig(
        name=name,
        path=path,
        max_batch_size=4,
        sequence_batching={
            "control_input": [
                {
                    "name": "CORRID",
                    "control": [{"kind": "CONTROL_SEQUENCE_CORRID", "data_type": kind}],
                },
                {
                    "name": "END",
                    "control": [{"kind": "CONTROL_SEQUENCE_END", "bool_false_true": [False, True]}],
                },
            ]
        },
    )
    return ModelSource(name, "1", path, config)


def test_control_inputs_corrid_uint64_and_string(tmp_path: Path) -> None:
    sources = [
        _corrid_model(tmp_path, TensorProto.UINT64, "ids"),
        _corrid_model(tmp_path, TensorProto.STRING, "names"),
    ]
    with serve_in_thread(sources=sources) as running:
        grpc = grpcclient.InferenceServerClient(running.grpc_url)
        http = httpclient.InferenceServerClient(url=running.url.removeprefix("http://"))
        # A uint64 past int64 travels over HTTP (tritonclient.grpc sends int64_param).
        cases = [(http, "ids", 2**63 + 5), (grpc, "ids", 2**40), (grpc, "names", "user-7")]
        for client, model, corrid in cases:
            mod = _mod(client)
            first = client.infer(model, _inputs(mod, 1), sequence_id=corrid, sequence_start=True)
            last = client.infer(model, _inputs(mod, 1), sequence_id=corrid, sequence_end=True)
            got = first.as_numpy("ID")[0][0]
            assert (got.decode() if isinstance(got, bytes) else int(got)) == corrid
            assert not first.as_numpy("LAST")[0][0] and last.as_numpy("LAST")[0][0]
        with pytest.raises(InferenceServerException, match="takes integer correlation IDs"):
            grpc.infer("ids", _inputs(grpcclient, 1), sequence_id="x", sequence_start=True)
        grpc.close()
        http.close()


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"direct": {}, "oldest": {}}, "direct or oldest, not both"),
        (
            {"control_input": [{"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_START"}]}]},
            "exactly one of",
        ),
        (
            {
                "control_input": [
                    {
                        "name": "C",
                        "control": [
                            {"kind": "CONTROL_SEQUENCE_CORRID", "int32_false_true": [0, 1]}
                        ],
                    }
                ]
            },
            "data_type",
        ),
        (
            {"control_input": [{"name": "S", "control": [{"kind": "CONTROL_SEQUENCE_BEGIN"}]}]},
            "CONTROL_SEQUENCE_START",
        ),
    ],
)
def test_sequence_batching_config_mistakes(section: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        SequenceBatchingConfig.model_validate(section)


FORGETFUL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            tensors = [pb_utils.Tensor("Y", x)]
            if int(x.reshape(-1)[0]) != 0:  # 0: the state output is forgotten
                tensors.append(pb_utils.Tensor("STATE_OUT", x))
            responses.append(pb_utils.InferenceResponse(tensors))
        return responses
"""


def test_a_state_output_the_model_did_not_return_is_a_clear_error(tmp_path: Path) -> None:
    """A model keeps its sequence's state in an output: a response without it ends that
    request with an error naming it (a model may leave other outputs out)."""
    folder = tmp_path / "forgetful"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] },\n'
        '        { name: "STATE_IN", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] },\n'
        '         { name: "STATE_OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
        'sequence_batching { state [ { input_name: "STATE_IN" output_name: "STATE_OUT"\n'
        "  data_type: TYPE_INT32 dims: [ 1 ] } ] }\n"
    )
    (folder / "1" / "model.py").write_text(FORGETFUL)
    with serve_in_thread(sources=scan_repository(tmp_path)) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))

        def send(value: int, *, start: bool) -> Any:
            tensor = httpclient.InferInput("X", [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            return client.infer("forgetful", [tensor], sequence_id=7, sequence_start=start)

        assert send(3, start=True).as_numpy("Y").tolist() == [3]
        with pytest.raises(InferenceServerException) as caught:
            send(0, start=False)
        assert "did not return its state output 'STATE_OUT'" in caught.value.message()
        client.close()


COUNTER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "STATE_IN").as_numpy()
            total = (state + x).astype(np.int32)
            responses.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", total), pb_utils.Tensor("STATE_OUT", total)]))
        return responses
"""


def _counter(tmp_path: Path, initial: str) -> Path:
    folder = tmp_path / "counter"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X", data_type: TYPE_INT32, dims: [ 2 ] },\n'
        '        { name: "STATE_IN", data_type: TYPE_INT32, dims: [ 2 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_INT32, dims: [ 2 ] },\n'
        '         { name: "STATE_OUT", data_type: TYPE_INT32, dims: [ 2 ] } ]\n'
        'sequence_batching { state [ { input_name: "STATE_IN" output_name: "STATE_OUT"\n'
        f"  data_type: TYPE_INT32 dims: [ 2 ] {initial} }} ] }}\n"
    )
    (folder / "1" / "model.py").write_text(COUNTER)
    return folder


def test_a_state_starts_from_its_initial_state_file(tmp_path: Path) -> None:
    """``initial_state { data_file }``: each sequence's state starts from the raw elements
    of that file of the model's ``initial_state/`` folder, as Triton reads it."""
    folder = _counter(
        tmp_path,
        'initial_state { name: "start" data_type: TYPE_INT32 dims: [ 2 ] data_file: "start" }',
    )
    (folder / "initial_state").mkdir()
    (folder / "initial_state" / "start").write_bytes(np.array([100, -5], np.int32).tobytes())
    with serve_in_thread(sources=scan_repository(tmp_path)) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))

        def send(value: int, sequence: int, *, start: bool, end: bool = False) -> list[int]:
            tensor = httpclient.InferInput("X", [2], "INT32")
            tensor.set_data_from_numpy(np.array([value, value], dtype=np.int32))
            answer = client.infer(
                "counter", [tensor], sequence_id=sequence, sequence_start=start, sequence_end=end
            )
            return [int(v) for v in answer.as_numpy("Y")]

        assert send(3, 1, start=True) == [103, -2]
        assert send(4, 1, start=False, end=True) == [107, 2]
        assert send(1, 2, start=True) == [101, -4]  # the next sequence starts from it too
        client.close()


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (b"\x00" * 12, "start holds 12 bytes, but 2 INT32 elements take 8"),
        (None, "initial_state data_file 'start' is not a file in"),
        ("link", "initial_state data_file 'start' is not a file in"),  # one that leads out
    ],
)
def test_an_initial_state_file_that_does_not_fit_stops_the_load(
    tmp_path: Path, data: bytes | str | None, said: str
) -> None:
    """The same rules as a warm-up sample's data file (``server/data_files.py``)."""
    folder = _counter(
        tmp_path,
        'initial_state { name: "start" data_type: TYPE_INT32 dims: [ 2 ] data_file: "start" }',
    )
    if data is not None:
        (folder / "initial_state").mkdir()
        if data == "link":
            outside = tmp_path / "elsewhere.bin"
            outside.write_bytes(b"\x00" * 8)  # the right size: refused for where it is
            (folder / "initial_state" / "start").symlink_to(outside)
        else:
            assert isinstance(data, bytes)
            (folder / "initial_state" / "start").write_bytes(data)
    with pytest.raises(Exception, match=said), serve_in_thread(sources=scan_repository(tmp_path)):
        pass
