"""ONNX Runtime's threads: the default count comes from the machine, spinning is off."""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path

import pytest
from pydantic import ValidationError

from sordino.backends.onnx import OnnxBackend
from sordino.config import ModelConfig
from sordino.execution.devices import default_intra_op_threads, model_tiers

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
