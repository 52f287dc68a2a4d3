"""The worker pipe's messages survive the pickling the pipe does."""

from __future__ import annotations

import pickle

import pytest

from sordino.execution.faults import FaultAction
from sordino.execution.messages import (
    HEARTBEAT,
    STOP,
    Alloc,
    Allocated,
    Call,
    CallFailed,
    Done,
    LoadFailed,
    ProfileStart,
    ProfileStop,
    ProfileStopped,
    Ready,
    Reply,
    Run,
    RunFailed,
)
from sordino.inference import ModelMetadata, TensorSpec
from sordino.memory.tensors import TensorHandle

HANDLE = TensorHandle(64, 16, "<f4", (1, 4), 64)
METADATA = ModelMetadata("m", "1", "test", (TensorSpec("x", "FP32", (-1, 4)),), (), True)


@pytest.mark.parametrize(
    "message",
    [
        Run(1, {"x": HANDLE}, {"y": TensorHandle(128, 0, "", (), 64)}, FaultAction("latency", 0.1)),
        Allocated(1, {"y": HANDLE}),
        Call(2, ProfileStart("/tmp/trace")),
        Call(3, ProfileStop()),
        STOP,
        Ready(METADATA, 123, 0.5),
        LoadFailed("ModelLoadError: no such file"),
        HEARTBEAT,
        Alloc(1, {"y": 4096}),
        Done(1, {"y": HANDLE}, 0.01),
        RunFailed(1, "oom", "MemoryError: "),
        Reply(3, ProfileStopped("/tmp/trace.json", 7)),
        CallFailed(2, "profile_start: RuntimeError: no"),
    ],
)
def test_messages_round_trip(message: object) -> None:
    """Each message pickles and comes back equal (and matches on its type)."""
    back = pickle.loads(pickle.dumps(message))
    assert back == message and type(back) is type(message)
