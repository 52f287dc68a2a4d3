"""The worker pipe's messages: their binary frames, and what a broken frame does."""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
from collections.abc import AsyncIterator, Iterator
from multiprocessing import shared_memory

import numpy as np
import pytest

from sordino.backends.base import ModelRunOptions
from sordino.clock import MonotonicClock
from sordino.execution.faults import FaultAction
from sordino.execution.messages import (
    HEADER_SIZE,
    HEARTBEAT,
    MAX_BODY,
    STOP,
    Alloc,
    Allocated,
    Call,
    CallFailed,
    Cancel,
    Done,
    FrameError,
    FrameReader,
    LoadFailed,
    ProfileStart,
    ProfileStop,
    ProfileStopped,
    Ready,
    Reply,
    Respond,
    Run,
    RunFailed,
    encode,
)
from sordino.execution.worker import WorkerLost, WorkerProcess
from sordino.execution.worker_main import WorkerSpec
from sordino.inference import ModelMetadata, RequestFacts, TensorSpec
from sordino.memory.tensors import BYTES, TensorHandle, write_tensor
from sordino.models.repository import builtin_sources

HANDLE = TensorHandle(64, 16, "<f4", (1, 4), 64)
METADATA = ModelMetadata("m", "1", "test", (TensorSpec("x", "FP32", (-1, 4)),), (), True)

MESSAGES = [
    Run(1, {"x": HANDLE}, {"y": TensorHandle(128, 0, "", (), 64)}, FaultAction("latency", 0.1)),
    Run(
        2**40,
        {
            "x": HANDLE,
            "name é": TensorHandle(0, 9, BYTES, (3,), 16),
            "s": TensorHandle(8, 4, "<i4", ()),
        },
        {},
        None,
        "psm_segment",
        (2, 1, 3),
    ),
    Run(
        3,
        {"x": HANDLE},
        {},
        FaultAction("error", 0.0),
        "",
        (1, 2),
        (
            RequestFacts(
                id="req-ü",
                correlation_id=2**64 - 1,
                parameters='{"k":"v"}',
                outputs=("y", "z"),
                flags=3,
                timeout_us=2**40,
                priority=2,
                deadline=1.7e9 + 0.25,
                tenant="acme",
            ),
            RequestFacts(correlation_id="session-a"),
        ),
    ),
    Allocated(1, {"y": HANDLE}),
    Call(2, ProfileStart("/tmp/trace")),
    Call(3, ProfileStop()),
    STOP,
    Ready(METADATA, 123, 0.5),
    Ready(METADATA, 124, 0.5, per_request=True),
    LoadFailed("ModelLoadError: no such file"),
    HEARTBEAT,
    Alloc(1, {"y": 4096, "z": 2**33}),
    Done(1, {"y": HANDLE, "empty": TensorHandle(0, 0, "<f4", (0, 4), 0)}, 0.01),
    Done(7, {}, 0.0),
    RunFailed(1, "oom", "MemoryError: "),
    RunFailed(2, "error", "ValueError: ünïcode " + "x" * 70000),
    Reply(3, ProfileStopped("/tmp/trace.json", 7)),
    Reply(4, None),
    CallFailed(2, "profile_start: RuntimeError: no"),
    Cancel(2**40, 7),
    Respond(3, 0, True, {}),
    Respond(4, 2, True, {}, "the model said ünïcode no"),
    Respond(4, 1, False, {}, "mid-stream", 3),
    Respond(4, 1, False, {}, "unknown", 0),
]


@pytest.mark.parametrize("message", MESSAGES, ids=lambda m: type(m).__name__)
def test_every_message_round_trips_through_its_frame(message: object) -> None:
    """Each message's frame reads back equal, of the same type, and leaves nothing over."""
    reader = FrameReader()
    (back,) = reader.feed(encode(message))  # type: ignore[arg-type]
    assert back == message and type(back) is type(message)
    assert reader.pending == 0


def test_the_hot_messages_are_not_pickled() -> None:
    """Run, Done, Alloc, Allocated, RunFailed, Heartbeat, Respond and Cancel carry no pickle."""
    for message in MESSAGES:
        if isinstance(message, Run) and message.fault is not None:
            continue  # a chaos fault (rare) travels pickled inside its Run
        frame = encode(message)  # type: ignore[arg-type]
        pickled = b"\x80" + bytes([pickle.HIGHEST_PROTOCOL]) in frame
        hot = isinstance(
            message, Run | Done | Alloc | Allocated | RunFailed | type(HEARTBEAT) | Respond | Cancel
        )
        assert pickled != hot or isinstance(message, type(STOP)), message


def test_a_decoupled_response_carries_its_tensors_in_the_frame() -> None:
    """Respond: numbers, strings and bytes, scalars and empty tensors come back equal,
    and the frame holds no pickle (one per response a decoupled model sends)."""
    outputs = {
        "OUT": np.array([[1, 2], [3, 4]], np.int32),
        "f": np.float64(2.5).reshape(()),
        "none": np.zeros((0, 3), np.float32),
        "text": np.array([["a", "ünï"], ["", "x" * 300]], dtype=object),
        "raw": np.array([b"\x00\x01", b""], dtype=np.object_),
    }
    frame = encode(Respond(2**33, 5, False, outputs))
    assert b"\x80" + bytes([pickle.HIGHEST_PROTOCOL]) not in frame
    (back,) = FrameReader().feed(frame)
    assert isinstance(back, Respond)
    assert (back.batch_id, back.index, back.final, back.error) == (2**33, 5, False, None)
    assert list(back.outputs) == list(outputs)
    for name in ("OUT", "f", "none"):
        assert back.outputs[name].dtype == outputs[name].dtype
        np.testing.assert_array_equal(back.outputs[name], outputs[name])
    assert back.outputs["text"].tolist() == [[b"a", "ünï".encode()], [b"", b"x" * 300]]
    assert back.outputs["raw"].tolist() == [b"\x00\x01", b""]


def test_frames_split_anywhere_and_joined_come_back_in_order() -> None:
    """Bytes fed one at a time, or all frames at once, give the same messages in order."""
    stream = b"".join(encode(m) for m in MESSAGES)  # type: ignore[arg-type]
    one_by_one = FrameReader()
    got = []
    for i in range(len(stream)):
        got += one_by_one.feed(stream[i : i + 1])
    assert got == MESSAGES and one_by_one.pending == 0
    assert FrameReader().feed(stream) == MESSAGES


def test_a_truncated_frame_waits_for_the_rest() -> None:
    """Part of a frame is held, not decoded and not an error."""
    frame = encode(Done(1, {"y": HANDLE}, 0.5))
    reader = FrameReader()
    assert reader.feed(frame[:-3]) == []
    assert reader.pending == len(frame) - 3
    assert reader.feed(frame[-3:]) == [Done(1, {"y": HANDLE}, 0.5)]


def _longer(frame: bytes, extra: bytes) -> bytes:
    """``frame`` with ``extra`` bytes added to its body (and its declared length)."""
    length, kind = struct.unpack_from("<IB", frame)
    return struct.pack("<IB", length + len(extra), kind) + frame[HEADER_SIZE:] + extra


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (struct.pack("<IB", 0, 99), "unknown frame kind 99"),
        (struct.pack("<IB", MAX_BODY + 1, 6), "declares"),
        (struct.pack("<IB", 3, 6) + b"abc", "middle of a field"),  # a Done body cut short
        (struct.pack("<IB", 0, 1), "middle of a field"),  # an empty Run
        (_longer(encode(Done(1, {}, 0.0)), b"??"), "after its message"),
        (_longer(encode(HEARTBEAT), b"extra"), "after its message"),
        (struct.pack("<IB", 4, 8) + b"junk", "garbled frame"),  # not a pickle
        (encode(Alloc(1, {"y": 1})).replace(b"y", b"\xff"), "garbled frame"),  # not UTF-8
    ],
    ids=["kind", "length", "short", "empty", "long", "heartbeat", "pickle", "utf8"],
)
def test_a_garbled_frame_is_a_frame_error(data: bytes, says: str) -> None:
    with pytest.raises(FrameError, match=says):
        FrameReader().feed(data)


def test_requests_with_the_same_facts_read_back_equal_and_bad_facts_are_frame_errors() -> None:
    """A Run's requests whose facts are the same bytes read back equal to what was sent,
    batch after batch (a reader keeps the records it decoded: they are frozen); facts
    that end early, or run past their frame, or are not UTF-8, are frame errors."""
    same = RequestFacts(id="", parameters='{"k":1}', priority=1, tenant="t")
    facts = (same, RequestFacts(id="other", correlation_id="s"), same, same)
    run = Run(1, {"x": HANDLE}, {}, None, "", (1, 1, 1, 1), facts)
    alike = Run(2, {}, {}, None, "", (1,) * 5, (same,) * 5)
    last_differs = Run(3, {}, {}, None, "", (1,) * 3, (same, same, facts[1]))
    reader = FrameReader()
    for _ in range(3):
        for sent in (run, alike, last_differs):
            (back,) = reader.feed(encode(sent))
            assert isinstance(back, Run) and back == sent
    frame = encode(Run(2, {}, {}, None, "", (1,), (RequestFacts(id="ab"),)))
    id_at = frame.index(b"ab")
    cut = struct.pack("<IB", len(frame) - HEADER_SIZE - 3, 1) + frame[HEADER_SIZE:-3]
    longer = bytearray(frame)
    struct.pack_into("<I", longer, id_at - 4, 2**20)  # the id's length runs past the frame
    not_utf8 = frame.replace(b"ab", b"\xff\xfe")
    alike_frame = encode(alike)
    alike_body = alike_frame[HEADER_SIZE:-1]  # the last request's facts end early
    alike_cut = struct.pack("<IB", len(alike_body), 1) + alike_body
    for bad in (cut, bytes(longer), not_utf8, alike_cut):
        with pytest.raises(FrameError):
            FrameReader().feed(bad)
    assert FrameReader().feed(frame)[0] == Run(2, {}, {}, None, "", (1,), (RequestFacts(id="ab"),))


def test_a_pickled_frame_carries_only_the_rare_messages() -> None:
    """A pickle of something else (here a Done) in a pickled frame is refused."""
    body = pickle.dumps(Done(1, {}, 0.0))
    with pytest.raises(FrameError, match="pickled frame holds a Done"):
        FrameReader().feed(struct.pack("<IB", len(body), 8) + body)


# -- a real worker process on the other end --------------------------------------------


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    segment = shared_memory.SharedMemory(create=True, size=1 << 16)
    yield segment
    segment.close()
    segment.unlink()


@pytest.fixture
async def started(segment: shared_memory.SharedMemory) -> AsyncIterator[WorkerProcess]:
    source = next(s for s in builtin_sources() if s.name == "digits-classifier")
    spec = WorkerSpec(
        model=source.name,
        version=source.version,
        index=0,
        path=str(source.path),
        run=ModelRunOptions("onnxruntime"),
        providers=("CPUExecutionProvider",),
        target="cpu",
        intra_op_threads=1,
        arena=segment.name,
        heartbeat_s=0.5,
        warmup_batches=0,
    )
    worker = WorkerProcess(spec, MonotonicClock())
    try:
        await worker.start(60)
        yield worker
    finally:
        await worker.stop()


async def test_a_garbled_frame_from_the_worker_loses_it_and_fails_its_batch(
    started: WorkerProcess,
) -> None:
    """Garbage read from a worker mid-batch: the batch fails at once, the worker is killed."""

    async def no_space(sizes: dict[str, int]) -> dict[str, TensorHandle]:
        raise AssertionError("not asked")

    batch = asyncio.create_task(
        started.run({}, {}, FaultAction("latency", 30.0), no_space, timeout_s=0)
    )
    await asyncio.sleep(0)  # the Run is sent; the worker sleeps in its fault
    started._received(struct.pack("<IB", 0, 99))
    with pytest.raises(WorkerLost, match="garbled message"):
        await asyncio.wait_for(batch, 10)
    assert "garbled message" in await asyncio.wait_for(started.dead, 10)
    assert not started.alive


async def test_a_garbled_frame_to_the_worker_makes_it_exit(started: WorkerProcess) -> None:
    """A worker that reads garbage exits (code 1) instead of waiting for more."""
    os.write(started._fd, struct.pack("<IB", 2, 42) + b"??")
    assert await asyncio.wait_for(started.dead, 10) == "exited with code 1"


async def test_a_garbled_answer_to_alloc_makes_the_worker_exit(
    started: WorkerProcess, segment: shared_memory.SharedMemory
) -> None:
    """Garbage where the worker waits for its output space: it exits, the batch is lost."""
    assert segment.buf is not None
    pixels = write_tensor(segment.buf, 0, 4096, np.zeros((1, 64), np.float32))

    async def garbled(sizes: dict[str, int]) -> dict[str, TensorHandle]:
        os.write(started._fd, b"\xff" * 16)  # a declared length far over MAX_BODY
        await asyncio.Event().wait()  # never answers; the worker's exit ends the batch
        raise AssertionError("unreachable")

    with pytest.raises(WorkerLost, match="exited with code 1"):
        await asyncio.wait_for(started.run({"pixels": pixels}, {}, None, garbled, timeout_s=0), 20)
