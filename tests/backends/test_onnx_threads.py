"""ONNX Runtime's threads: the default count comes from the machine, spinning is off."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import pytest
from pydantic import ValidationError

from sordino.backends.onnx import OnnxBackend
from sordino.clock import MonotonicClock
from sordino.config import ModelConfig, RuntimeConfig
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.execution.devices import default_intra_op_threads, model_tiers
from sordino.inference import ModelKey
from sordino.models.repository import builtin_sources

DIGITS = Path(str(resources.files("sordino.models.builtin").joinpath("digits-classifier.onnx")))
CORES = len(os.sched_getaffinity(0))


def model(**keys: object) -> ModelConfig:
    return ModelConfig.model_validate(
        {"name": "digits", "path": "digits.onnx", "instance_kind": "cpu", **keys}
    )


def test_default_threads_share_the_cores_among_instances() -> None:
    assert default_intra_op_threads(1) == CORES
    assert default_intra_op_threads(2) == max(1, CORES // 2)
    assert default_intra_op_threads(CORES * 4) == 1


@pytest.mark.parametrize("instances", [1, 2, 3])
def test_a_model_without_threads_gets_the_default(instances: int) -> None:
    ((device,),) = (t.devices for t in model_tiers(model(instance_count=instances), None))
    assert device.intra_op_threads == max(1, CORES // instances)


def test_configured_threads_win_over_the_default() -> None:
    ((device,),) = (t.devices for t in model_tiers(model(intra_op_threads=7), None))
    assert device.intra_op_threads == 7


def _session_entry(backend: OnnxBackend, key: str) -> str:
    options = backend._session.get_session_options()  # the live session's own options
    return str(options.get_session_config_entry(key))


def test_spinning_is_off_by_default() -> None:
    backend = OnnxBackend(name="digits", version="1", intra_op_threads=2)
    backend.load(DIGITS)
    assert _session_entry(backend, "session.intra_op.allow_spinning") == "0"
    assert _session_entry(backend, "session.inter_op.allow_spinning") == "0"
    assert backend._session.get_session_options().intra_op_num_threads == 2


def test_spinning_on_when_the_model_asks() -> None:
    backend = OnnxBackend(name="digits", version="1", thread_spinning=True)
    backend.load(DIGITS)
    assert _session_entry(backend, "session.intra_op.allow_spinning") == "1"
    assert _session_entry(backend, "session.inter_op.allow_spinning") == "1"


def test_thread_spinning_must_be_a_boolean() -> None:
    with pytest.raises(ValidationError, match="thread_spinning"):
        model(thread_spinning="sometimes")


@pytest.mark.parametrize("spinning", [False, True])
async def test_the_model_setting_reaches_its_sessions(spinning: bool) -> None:
    """``thread_spinning`` in a model's configuration is what its sessions run with."""
    source = next(s for s in builtin_sources() if s.name == "digits-classifier")
    config = source.config.model_copy(
        update={"isolation": "thread", "thread_spinning": spinning, "instance_count": 2}
    )
    key = ModelKey(source.name, source.version)
    executor = ChainExecutor(RuntimeConfig(), clock=MonotonicClock(), events=EventSink())
    try:
        await executor.load(key, source.path, config)
        backends = executor.local_backends(key)
        assert len(backends) == 2
        for backend in backends:
            assert isinstance(backend, OnnxBackend)
            want = "1" if spinning else "0"
            assert _session_entry(backend, "session.intra_op.allow_spinning") == want
            threads = backend._session.get_session_options().intra_op_num_threads
            assert threads == max(1, CORES // 2)
    finally:
        await executor.aclose()
