"""A Triton Python model's tensors and the arena, in a worker's run loop.

Inputs reach ``execute`` as the model's own copy of the batch's rows in the arena (one
copy a batch: the model may write into them, as on Triton); each response's output tensor is copied
once, straight into its rows of the block the server reserved for the output (no joined
batch made first). The worker's loop (``worker_loop.serve``) runs here in a thread of the
test over a real pipe and a real shared-memory arena; the test plays the server's end
of the pipe (Run, Alloc answered with Allocated, Done).
"""

from __future__ import annotations

import os
import threading
import tracemalloc
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sordino.backends.base import BackendOptions
from sordino.backends.python.backend import PythonBackend
from sordino.execution.messages import (
    STOP,
    Alloc,
    Allocated,
    Done,
    FrameReader,
    Run,
    RunFailed,
    encode,
)
from sordino.execution.worker_link import WorkerLink
from sordino.execution.worker_loop import Streams, serve
from sordino.execution.worker_main import MappedArena
from sordino.inference import REQUEST_APART, RequestFacts, decode_request_apart
from sordino.memory import Arena, view_tensor, write_tensor
from sordino.memory.tensors import TensorHandle

MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.inputs = []

    def execute(self, requests):
        # Each response's Y is the request's X as it came (a view: nothing allocated);
        # LABEL is a string per row; SHAPED has a second dimension that varies (W > 0).
        self.inputs = [pb_utils.get_input_tensor_by_name(r, "X").as_numpy() for r in requests]
        responses = []
        for x in self.inputs:
            width = int(x[0, 0]) if x[0, 0] > 0 else 1
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("Y", x),
                pb_utils.Tensor("LABEL", np.array([[b"row"]] * len(x), dtype=object)),
                pb_utils.Tensor("SHAPED", np.zeros((len(x), width), np.int16)),
            ]))
        return responses
"""

CONFIG = """
backend: "python"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ -1 ] } ]
output [
  { name: "Y", data_type: TYPE_FP32, dims: [ -1 ] },
  { name: "LABEL", data_type: TYPE_STRING, dims: [ 1 ] },
  { name: "SHAPED", data_type: TYPE_INT16, dims: [ -1 ] }
]
"""

MB = 1 << 20


@dataclass
class Worker:
    """The worker's loop in a thread, the server's end of its pipe, and the arena."""

    conn: Connection
    arena: Arena
    backend: PythonBackend
    mapped: MappedArena
    frames: FrameReader

    def run(self, run: Run) -> Done | RunFailed:
        """Send ``run``; answer its Alloc (each asked size, fresh blocks); return its end."""
        fd = self.conn.fileno()
        os.write(fd, encode(run))
        while True:
            for message in self.frames.feed(os.read(fd, 1 << 16)):
                if isinstance(message, Alloc):
                    space = {
                        name: TensorHandle.space(self.arena.acquire_nowait(size))
                        for name, size in message.sizes.items()
                    }
                    os.write(fd, encode(Allocated(message.batch_id, space)))
                elif isinstance(message, Done | RunFailed):
                    return message


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[Worker]:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(CONFIG)
    (tmp_path / "m" / "1" / "model.py").write_text(MODEL)
    backend = PythonBackend(BackendOptions(name="m", version="1"))
    backend.load(tmp_path / "m" / "1" / "model.py")
    arena = Arena(64 * MB)
    mapped = MappedArena(arena.name)
    ours, theirs = Pipe()
    link = WorkerLink(theirs)
    streams = Streams(link)
    link.watch_cancels(streams.cancel)  # as worker_main does for a per-request backend
    loop = threading.Thread(target=serve, args=(link, backend, mapped, streams), daemon=True)
    loop.start()
    try:
        yield Worker(ours, arena, backend, mapped, FrameReader())
    finally:
        os.write(ours.fileno(), encode(STOP))
        loop.join(30)
        backend.unload()
        backend._model = None
        assert mapped.segment is not None
        mapped.segment.close()
        arena.close()


def _batch(worker: Worker, rows: list[np.ndarray], space: dict[str, int]) -> Run:
    """A Run of one request per array of ``rows`` (X), with output space of these sizes."""
    x = np.concatenate(rows)
    block = worker.arena.acquire_nowait(int(x.nbytes))
    handle = write_tensor(worker.arena.buffer, block.offset, block.size, x)
    reserved = {
        name: TensorHandle.space(worker.arena.acquire_nowait(size)) for name, size in space.items()
    }
    facts = tuple(RequestFacts(id=str(i)) for i in range(len(rows)))
    return Run(1, {"X": handle}, reserved, None, rows=tuple(len(r) for r in rows), requests=facts)


def test_inputs_are_the_models_own_copies(worker: Worker) -> None:
    """What ``execute`` reads as a request's input is a copy of its rows in the arena (one
    copy of the batch's input), which the model may write into, as on Triton: the block
    is read again after it (a pipeline's other steps, a batch run again)."""
    rows = [np.full((1, 4), -i, np.float32) for i in range(3)]
    done = worker.run(_batch(worker, rows, {}))
    assert isinstance(done, Done), done
    assert worker.mapped.segment is not None
    arena = np.frombuffer(worker.mapped.segment.buf, np.uint8)
    seen: list[Any] = worker.backend._model.inputs
    assert [x.tolist() for x in seen] == [r.tolist() for r in rows]
    assert not any(np.shares_memory(x, arena) for x in seen)
    assert all(x.flags.writeable for x in seen)
    assert all(np.shares_memory(x, seen[0].base) for x in seen)  # one copy of the batch
    del arena, seen
    worker.backend._model.inputs = []


def test_each_response_is_copied_once_straight_into_the_reserved_block(worker: Worker) -> None:
    """Eight requests of 2 MB each: the outputs lie in the block the server reserved, and
    the worker allocates nothing near their size on the way beyond the inputs' copy (a
    joined batch of 16 MB, then copied into the arena, was how outputs went before)."""
    width = MB // 2  # 2 MB of FP32 a request
    rows = [np.full((1, width), i - 8, np.float32) for i in range(8)]  # X[0, 0] <= 0
    total = 8 * width * 4
    run = _batch(worker, rows, {"Y": total, "SHAPED": 8 * 2})
    tracemalloc.start()
    try:
        done = worker.run(run)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert isinstance(done, Done), done
    y = done.outputs["Y"]
    assert (y.offset, y.nbytes, y.dtype) == (run.space["Y"].offset, total, "<f4")
    assert y.shape == (8, width)
    out = view_tensor(worker.arena.buffer, y)
    assert np.array_equal(out, np.concatenate(rows))
    del out
    # The model's responses are views of its inputs: what the batch allocated is the
    # inputs' one copy (the model's own, 16 MB), then the requests, the responses and the
    # frames, far below one output's 2 MB — no joined output batch.
    assert peak < total + MB, f"{peak} bytes allocated while the batch ran and was answered"
    labels = view_tensor(worker.arena.buffer, done.outputs["LABEL"])
    assert labels.shape == (8, 1) and labels[0, 0] == b"row"


def test_outputs_larger_than_the_space_reserved_are_placed_after_one_alloc(
    worker: Worker,
) -> None:
    """No space reserved for a numeric output of unknown size: the worker asks for it
    (Alloc) and the responses are written into the block it gets."""
    rows = [np.full((2, 3), -1, np.float32), np.full((1, 3), -2, np.float32)]
    done = worker.run(_batch(worker, rows, {}))
    assert isinstance(done, Done), done
    y = view_tensor(worker.arena.buffer, done.outputs["Y"])
    assert y.tolist() == [[-1, -1, -1], [-1, -1, -1], [-2, -2, -2]]
    shaped = view_tensor(worker.arena.buffer, done.outputs["SHAPED"])
    assert shaped.shape == (3, 1) and shaped.dtype == np.int16
    del y, shaped


def test_responses_whose_shapes_do_not_join_go_to_each_request_as_they_are(
    worker: Worker,
) -> None:
    """SHAPED is 1 wide for one request and 2 for the other (Triton answers each with its
    own): the others are joined into the arena, SHAPED is each request's own tensor in
    REQUEST_APART, and the batch is not failed (it was, and was then run again request
    by request)."""
    rows = [np.full((1, 2), 1, np.float32), np.full((1, 2), 2, np.float32)]
    done = worker.run(_batch(worker, rows, {}))
    assert isinstance(done, Done), done
    assert "SHAPED" not in done.outputs
    y = view_tensor(worker.arena.buffer, done.outputs["Y"])
    assert y.tolist() == [[1, 1], [2, 2]]
    column = view_tensor(worker.arena.buffer, done.outputs[REQUEST_APART])
    apart = [_own(a) for a in decode_request_apart(column, 2)]
    assert [a["SHAPED"].shape for a in apart] == [(1, 1), (1, 2)]
    assert all(a["SHAPED"].dtype == np.int16 for a in apart)
    del y, column


def _own(entry: list[tuple[int, str, np.ndarray]] | None) -> dict[str, np.ndarray]:
    """A request's own tensors by name (its place among the outputs: SHAPED is the third)."""
    assert entry is not None
    assert [(place, name) for place, name, _ in entry] == [(2, "SHAPED")]
    return {name: array for _, name, array in entry}


def test_without_an_arena_the_outputs_are_joined_and_the_others_set_apart(
    worker: Worker,
) -> None:
    """A thread instance or a Ray actor passes no ``place``: the outputs come back
    joined, those that cannot be joined in REQUEST_APART."""
    x = np.array([[-1, -1], [-2, -2]], np.float32)
    outputs = worker.backend.infer_requests({"X": x}, (1, 1))
    assert outputs["Y"].tolist() == x.tolist() and outputs["SHAPED"].shape == (2, 1)
    assert REQUEST_APART not in outputs
    outputs = worker.backend.infer_requests({"X": np.array([[1, 1], [2, 2]], np.float32)}, (1, 1))
    apart = [_own(a) for a in decode_request_apart(outputs[REQUEST_APART], 2)]
    assert [a["SHAPED"].shape for a in apart] == [(1, 1), (1, 2)]
    assert "SHAPED" not in outputs and outputs["Y"].shape == (2, 2)


def test_an_output_the_worker_cannot_send_fails_its_batch_and_the_worker_serves_on(
    worker: Worker,
) -> None:
    """An output the model made that cannot be written into the arena (here: a Tensor
    whose array the model changed after making it, to elements that are not strings)
    fails its batch saying why; the worker went on serving (it exited before)."""

    class Odd:
        def __str__(self) -> str:
            raise ValueError("no text")

    model = worker.backend._model
    execute = model.execute

    def spoiled(requests: Any) -> Any:
        responses = execute(requests)
        for response in responses:
            response.output_tensors()[1].as_numpy()[0, 0] = Odd()  # LABEL
        return responses

    model.execute = spoiled
    try:
        failed = worker.run(_batch(worker, [np.full((1, 2), -1, np.float32)] * 2, {}))
    finally:
        model.execute = execute
    assert isinstance(failed, RunFailed), failed
    assert "cannot send the outputs" in failed.message and "BYTES element 0" in failed.message
    done = worker.run(_batch(worker, [np.full((1, 2), -1, np.float32)], {}))
    assert isinstance(done, Done)
