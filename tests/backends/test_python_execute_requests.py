"""The requests ``execute`` gets, and the answers it gives, behave as Triton's.

The backend builds these objects cheaply (its senders, a request's preferred memory and
trace are made on first use; the inputs and the requested outputs are kept without a
copy): every accessor still answers as ``pb_utils.InferenceRequest(...)``'s would. The
backend runs in this process, without a server.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sordino.backends.base import BackendOptions
from sordino.backends.python.backend import PythonBackend, PythonModelError
from sordino.backends.python.joining import join_outputs, output_layouts
from sordino.inference import (
    REQUEST_ABSENT,
    REQUEST_PARAMETERS,
    RequestFacts,
    decode_request_absent,
    decode_request_parameters,
)

MODEL = """
import weakref

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.seen = []
        self.refused = []

    def execute(self, requests):
        self.seen = []
        self.requests = [weakref.ref(r) for r in requests]
        returned = []
        for index, request in enumerate(requests):
            names = request.requested_output_names()
            names.append("changed")  # a copy: nothing the next call or request sees
            inputs = request.inputs()
            inputs.clear()
            memory = request.preferred_memory()
            self.seen.append({
                "id": request.request_id(),
                "outputs": request.requested_output_names(),
                "inputs": [t.name() for t in request.inputs()],
                "x": pb_utils.get_input_tensor_by_name(request, "X").as_numpy().tolist(),
                "absent": pb_utils.get_input_tensor_by_name(request, "nope"),
                "memory": (memory is request.preferred_memory(), memory.preferred_memory_type,
                           memory.preferred_device_id),
                "trace": (request.trace() is request.trace(), request.trace().get_context()),
                "sender": request.get_response_sender() is request.get_response_sender(),
                "version": request.model_version(),
                "parameters": request.parameters(),
                "flags": request.flags(),
                "cancelled": request.is_cancelled(),
            })
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("Y", x * 10)])
            if index % 2 == 0:  # even requests answer through their sender
                sender = request.get_response_sender()
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                try:
                    sender.send(response)
                except pb_utils.TritonModelException as exc:
                    self.refused.append(str(exc))
                returned.append(None)
            else:
                returned.append(response)
        return returned
"""

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [
  { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] },
  { name: "A", data_type: TYPE_INT32, dims: [ 1 ] }
]
"""


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[PythonBackend]:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(CONFIG)
    # Y only: the model gives no A (each request is answered without it).
    (tmp_path / "m" / "1" / "model.py").write_text(MODEL)
    loaded = PythonBackend(BackendOptions(name="m", version="1"))
    loaded.load(tmp_path / "m" / "1" / "model.py")
    yield loaded
    loaded.unload()


def test_each_request_answers_as_tritons_and_sent_responses_take_their_place(
    backend: PythonBackend,
) -> None:
    """Three requests: their accessors answer as a made request's do, copies where
    Triton's give copies; requests 0 and 2 answer through their senders (a second
    send is refused with Triton's message), request 1 by returning; the answers lack
    the declared output A, which is left out of the outputs."""
    batch = {"X": np.array([[1], [2], [3]], np.int32)}
    facts = [RequestFacts(id="a"), RequestFacts(id="b", outputs=("Y",)), RequestFacts(id="c")]
    asked: list[int] = []

    def cancelled(index: int) -> bool:
        asked.append(index)
        return index == 1

    model: Any = backend._model
    gc.disable()  # the requests (arena views) must go when the batch ends, not at a GC
    try:
        outputs = backend.infer_requests(batch, [1, 1, 1], facts, cancelled)
        assert all(ref() is None for ref in model.requests)
    finally:
        gc.enable()
    # No response has A: it is left out (Triton answers each request without it).
    assert set(outputs) == {"Y"} and outputs["Y"].tolist() == [[10], [20], [30]]
    seen = model.seen
    assert [s["id"] for s in seen] == ["a", "b", "c"]
    assert [s["outputs"] for s in seen] == [["A", "Y"], ["Y"], ["A", "Y"]]
    assert [s["inputs"] for s in seen] == [["X"]] * 3
    assert [s["x"] for s in seen] == [[[1]], [[2]], [[3]]]
    assert all(s["absent"] is None for s in seen)
    assert all(s["memory"] == (True, -1, 0) for s in seen)
    assert all(s["trace"] == (True, None) for s in seen)
    assert all(s["sender"] is True for s in seen)
    assert all((s["version"], s["parameters"], s["flags"]) == (-1, "{}", 0) for s in seen)
    assert [s["cancelled"] for s in seen] == [False, True, False] and asked == [0, 1, 2]
    assert (
        model.refused
        == ["Unable to send response. Non-decoupled model cannot send more than one response."] * 2
    )


def test_the_responses_sent_and_returned_join_in_request_order(tmp_path: Path) -> None:
    """With Y the only output, the sent (0, 2) and returned (1) responses join in order."""
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(
        CONFIG.replace('  { name: "A", data_type: TYPE_INT32, dims: [ 1 ] }\n', "").replace(
            "dims: [ 1 ] },", "dims: [ 1 ] }"
        )
    )
    (tmp_path / "m" / "1" / "model.py").write_text(MODEL)
    backend = PythonBackend(BackendOptions(name="m", version="1"))
    backend.load(tmp_path / "m" / "1" / "model.py")
    try:
        outputs = backend.infer_requests({"X": np.array([[1], [2], [3]], np.int32)}, [1, 1, 1])
        assert outputs["Y"].tolist() == [[10], [20], [30]]
        placed: dict[str, Any] = {}

        def place(layouts: dict[str, Any]) -> dict[str, Any]:
            placed.update({name: np.zeros(shape, dt) for name, (dt, shape) in layouts.items()})
            return placed

        given = backend.infer_requests(
            {"X": np.array([[4], [5], [6]], np.int32)}, [1, 1, 1], place=place
        )
        assert given["Y"] is placed["Y"] and placed["Y"].dtype == np.int32
        assert placed["Y"].tolist() == [[40], [50], [60]]
    finally:
        backend.unload()


def test_string_inputs_reach_execute_as_tritons_object_arrays(tmp_path: Path) -> None:
    """An input given as numpy strings (a thread instance's batch) is an object array in
    ``execute``, as ``pb_utils.Tensor`` makes it."""
    (tmp_path / "s" / "1").mkdir(parents=True)
    (tmp_path / "s" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "T", data_type: TYPE_STRING, dims: [ 1 ] } ]\n'
        'output [ { name: "K", data_type: TYPE_STRING, dims: [ 1 ] } ]\n'
    )
    (tmp_path / "s" / "1" / "model.py").write_text(
        "import numpy as np\nimport triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        by_name = pb_utils.get_input_tensor_by_name\n"
        "        arrays = [by_name(r, 'T').as_numpy() for r in requests]\n"
        "        kinds = [np.array([[a.dtype.kind]], dtype=object) for a in arrays]\n"
        "        return [pb_utils.InferenceResponse([pb_utils.Tensor('K', k)]) for k in kinds]\n"
    )
    backend = PythonBackend(BackendOptions(name="s", version="1"))
    backend.load(tmp_path / "s" / "1" / "model.py")
    try:
        outputs = backend.infer_requests({"T": np.array([["a"], ["b"]])}, [1, 1])
        assert outputs["K"].tolist() == [["O"], ["O"]]
    finally:
        backend.unload()


def test_responses_of_different_dtypes_join_as_numpy_joins_them() -> None:
    """The join's dtype and rows are ``np.concatenate``'s, written into the placed array;
    strings are not placed; tensors whose other dimensions differ cannot be joined."""
    parts: dict[str, list[Any]] = {
        "Y": [np.array([[1]], np.int32), np.array([[2.5], [3.5]], np.float32)],
        "S": [np.array([[b"a"]], object), np.array([[b"b"]], object)],
        "Z": [np.array([[True]]), np.array([[False]])],
    }
    layouts = output_layouts(parts, "m")
    assert layouts == {"Y": (np.dtype(np.float64), (3, 1)), "Z": (np.dtype(bool), (2, 1))}
    placed = {name: np.empty(shape, dtype) for name, (dtype, shape) in layouts.items()}
    joined = join_outputs(parts, placed)
    assert joined["Y"] is placed["Y"] and joined["Y"].tolist() == [[1.0], [2.5], [3.5]]
    assert joined["Z"].tolist() == [[True], [False]] and joined["S"].tolist() == [[b"a"], [b"b"]]
    with pytest.raises(PythonModelError, match="request 1 \\[2, 2\\]"):
        output_layouts({"Y": [np.zeros((1, 1)), np.zeros((2, 2))]}, "m")
    with pytest.raises(PythonModelError, match="request 1 \\[\\]"):
        output_layouts({"Y": [np.zeros((1, 1)), np.zeros(())]}, "m")


REQUESTED_ONLY = Path(__file__).parent.parent / "fixtures" / "triton_python_answers"


def test_outputs_some_responses_lack_are_filled_and_named(tmp_path: Path) -> None:
    """Three requests asking for A, B, and both: A and B join with filler rows for the
    requests that lack them (zeros, empty strings), which REQUEST_ABSENT names; C, which
    no response has, is left out; placed arrays get the filler too."""
    folder = tmp_path / "requested_only"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        (REQUESTED_ONLY / "requested_only" / "config.pbtxt").read_text()
    )
    (folder / "1" / "model.py").write_text(
        (REQUESTED_ONLY / "requested_only" / "1" / "model.py").read_text()
    )
    backend = PythonBackend(BackendOptions(name="requested_only", version="1"))
    backend.load(folder / "1" / "model.py")
    facts = [RequestFacts(outputs=("A",)), RequestFacts(outputs=("B",)), RequestFacts()]
    batch = {"X": np.array([[1], [2], [3], [4]], np.int32)}
    try:
        for place in (None, lambda layouts: {n: np.zeros(s, d) for n, (d, s) in layouts.items()}):
            outputs = backend.infer_requests(batch, [1, 2, 1], facts, place=place)
            assert set(outputs) == {"A", "B", REQUEST_ABSENT}
            assert outputs["A"].tolist() == [[10], [0], [0], [40]]
            assert outputs["B"].tolist() == [[b""], [b"2"], [b"3"], [b"4"]]
            assert decode_request_absent(outputs[REQUEST_ABSENT], 3) == [("B",), ("A",), ()]
    finally:
        backend.unload()


def test_response_parameters_come_with_the_batch_beside_its_outputs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """InferenceResponse(parameters=...) (newer Tritons send them to the client) comes
    out in REQUEST_PARAMETERS, each request's own, and nothing is said dropped."""
    (tmp_path / "p" / "1").mkdir(parents=True)
    (tmp_path / "p" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
    )
    (tmp_path / "p" / "1" / "model.py").write_text(
        "import triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        "        x = [pb_utils.get_input_tensor_by_name(r, 'X') for r in requests]\n"
        "        return [pb_utils.InferenceResponse([pb_utils.Tensor('Y', t.as_numpy())],\n"
        "                                           parameters={'seen': int(t.as_numpy()[0, 0])})\n"
        "                for t in x]\n"
    )
    backend = PythonBackend(BackendOptions(name="p_params", version="1"))
    backend.load(tmp_path / "p" / "1" / "model.py")
    try:
        with caplog.at_level("WARNING", logger="sordino.python_model"):
            outputs = backend.infer_requests({"X": np.array([[1], [2]], np.int32)}, [1, 1])
        assert outputs["Y"].tolist() == [[1], [2]]
        given = decode_request_parameters(outputs[REQUEST_PARAMETERS], 2)
        assert given == [{"seen": 1}, {"seen": 2}]
        assert not [r for r in caplog.records if "parameters" in r.getMessage()]
    finally:
        backend.unload()
