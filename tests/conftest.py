"""Shared fixtures: a real server on a loopback port, direct ONNX Runtime references; the
README replay started beside the suite (tests/readme_replay.py)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from importlib import resources
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from sordino.models.repository import ModelSource, builtin_sources
from sordino.testing import RunningServer, serve_in_thread
from tests import readme_replay

# The suite's child processes (`sordino` commands, front ends, the workers' forkserver)
# may keep the bytecode of what they import in __pycache__ (which git ignores). Where the
# environment sets PYTHONDONTWRITEBYTECODE, as some CI images do, each of hundreds of them
# compiled sordino's modules afresh: 0.15 s of CPU a process (docs/benchmarks.md).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the README replay beside the suite when this session runs it.

    It takes minutes, mostly of waiting; its test, near the end, waits for its result
    (tests/readme_replay.py). Not under pytest-xdist, where its test starts it.
    """
    if session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if session.testsfailed:
        return  # collection errors: the session stops before any test
    if shutil.which("git") is None:
        return  # the test is skipped: the replay copies the checkout with git
    for item in session.items:
        if item.nodeid.endswith(readme_replay.TEST_ID):
            readme_replay.start(list(item.module.NOT_RUNNABLE))  # type: ignore[attr-defined]


def pytest_sessionfinish(session: pytest.Session) -> None:
    readme_replay.stop()


@pytest.fixture(scope="session")
def server() -> Iterator[RunningServer]:
    """The built-in models served by a real server for the whole session."""
    with serve_in_thread() as running:
        yield running


def thread_isolated(sources: list[ModelSource]) -> list[ModelSource]:
    """``sources`` with every model run on a thread of the server process.

    Tests that hold a batch inside a backend (``tests/server/helpers.Gate``) need the
    backend in this process; worker processes are tested on their own.
    """
    return [
        dataclasses.replace(s, config=s.config.model_copy(update={"isolation": "thread"}))
        for s in sources
    ]


@pytest.fixture(scope="session")
def thread_server() -> Iterator[RunningServer]:
    """The built-in models on threads of a real server (see :func:`thread_isolated`)."""
    with serve_in_thread(sources=thread_isolated(builtin_sources())) as running:
        yield running


@pytest.fixture(scope="session")
def reference() -> dict[str, Any]:
    """Direct ONNX Runtime sessions on the built-in model files (the unbatched truth)."""
    root = resources.files("sordino.models.builtin")
    sessions = {}
    for name in ("digits-classifier", "simple", "text-normalizer"):
        sessions[name] = ort.InferenceSession(
            str(root.joinpath(f"{name}.onnx")), providers=["CPUExecutionProvider"]
        )
    return sessions


def digits_pixels(n: int, seed: int = 0) -> np.ndarray:
    """``n`` rows of plausible 8x8 digit pixels (0-16) as FP32."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 17, size=(n, 64)).astype(np.float32)
