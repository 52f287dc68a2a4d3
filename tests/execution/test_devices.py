"""A model's ``execution_providers`` is a list of preferences, not of requirements."""

from __future__ import annotations

import logging

import pytest

from sordino.config import ModelConfig
from sordino.errors import ModelLoadError
from sordino.execution import devices
from sordino.execution.devices import model_tiers

CPU, CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


@pytest.fixture
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "available_providers", lambda: ["AzureExecutionProvider", CPU])


def model(**keys: object) -> ModelConfig:
    return ModelConfig.model_validate({"name": "digits", "path": "digits.onnx", **keys})


def test_missing_preferred_provider_falls_back_with_one_line(
    cpu_only: None, caplog: pytest.LogCaptureFixture
) -> None:
    """[cuda, cpu] without CUDA runs on the CPU, and one warning says why."""
    caplog.set_level(logging.INFO, logger="sordino")
    (tier,) = model_tiers(model(execution_providers=["cuda", "cpu"]), None)
    assert tier.name == "cpu"
    assert [d.providers for d in tier.devices] == [(CPU,)]
    assert [r.getMessage() for r in caplog.records] == [
        "model digits: CUDAExecutionProvider is not in this onnxruntime build; "
        "falling back to CPUExecutionProvider"
    ]
    assert caplog.records[0].levelno == logging.WARNING


def test_available_preferred_provider_is_used_quietly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """With CUDA present the model runs on the GPU tier, CPU kept as ONNX Runtime's fallback."""
    monkeypatch.setattr(devices, "available_providers", lambda: [CUDA, CPU])
    caplog.set_level(logging.INFO, logger="sordino")
    (tier,) = model_tiers(model(execution_providers=["cuda", "cpu"]), None)
    assert tier.name == "gpu"
    assert [(d.providers, d.target) for d in tier.devices] == [((CUDA, CPU), "cuda:0")]
    assert caplog.records == []


def test_no_listed_provider_available_names_the_available_ones(cpu_only: None) -> None:
    """Only a list of which nothing is here is an error, and it says what is here."""
    with pytest.raises(ModelLoadError) as failure:
        model_tiers(model(execution_providers=["cuda", "tensorrt"]), None)
    assert str(failure.value).startswith(
        "model digits: none of its execution_providers (CUDAExecutionProvider, "
        "TensorrtExecutionProvider) is in this onnxruntime build "
        "(available: AzureExecutionProvider, CPUExecutionProvider)"
    )


def test_explicit_instance_kind_ignores_the_provider_list(
    cpu_only: None, caplog: pytest.LogCaptureFixture
) -> None:
    """``instance_kind: cpu`` decides by itself: no fallback line, no error."""
    caplog.set_level(logging.INFO, logger="sordino")
    (tier,) = model_tiers(model(execution_providers=["cuda"], instance_kind="cpu"), None)
    assert tier.devices[0].providers == (CPU,)
    assert caplog.records == []
