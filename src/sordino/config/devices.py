"""The ``devices`` section: named ONNX Runtime providers that a fallback chain names."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated

from pydantic import BeforeValidator, Field

from sordino.config.base import Section

__all__ = ["EXECUTION_PROVIDERS", "DeviceConfig", "ProviderName"]

EXECUTION_PROVIDERS: Mapping[str, str] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "dml": "DmlExecutionProvider",
}
"""Short alias -> ONNX Runtime provider name; either spelling is accepted."""


def _provider_name(name: object) -> object:
    if not isinstance(name, str):
        return name
    valid = {full.lower(): full for full in EXECUTION_PROVIDERS.values()}
    valid.update(EXECUTION_PROVIDERS)
    if name.lower() in valid:
        return valid[name.lower()]
    choices = ", ".join([*EXECUTION_PROVIDERS, *EXECUTION_PROVIDERS.values()])
    raise ValueError(f"unknown execution provider {name!r}; valid: {choices}")


ProviderName = Annotated[str, BeforeValidator(_provider_name)]
"""An ONNX Runtime provider, given by its full name or an alias; stored as the full name."""


class DeviceConfig(Section):
    """One device a fallback chain can name: an ONNX Runtime provider and its settings."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Name used by ``fallback_chain`` and by chaos targets (``device:NAME``)."""
    provider: ProviderName = "CPUExecutionProvider"
    """ONNX Runtime provider (aliases cpu, cuda, tensorrt, ... accepted)."""
    device_id: int = Field(default=0, ge=0)
    """Device index for CUDA/TensorRT providers; ignored for cpu."""
    intra_op_threads: int | None = Field(default=None, ge=1)
    """Threads per operator on this device; overrides the model's ``intra_op_threads``."""
