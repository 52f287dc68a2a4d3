"""The instance pool on fake instances: what load and scale do when an instance cannot start."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sordino.config import ModelConfig, RuntimeConfig
from sordino.config.workers import OutlierEjectionConfig
from sordino.events import EventSink
from sordino.execution.devices import Device
from sordino.execution.outliers import OutlierDetector
from sordino.execution.placement import Placement
from sordino.execution.pool import InstancePool
from sordino.inference import ModelKey, ModelMetadata
from sordino.testing import VirtualClock

KEY = ModelKey("m", "1")
METADATA = ModelMetadata(
    name="m", version="1", platform="fake", inputs=(), outputs=(), batched=True
)


@dataclass
class _Stats:
    pid: int | None = None


class FakeInstance:
    """An instance that starts, or fails to start when its device is in ``failing``."""

    isolation = "thread"
    busy = 0

    def __init__(self, index: int, device: Device, failing: set[str]) -> None:
        self.index = index
        self.device = device
        self.subject = f"model:m/{index}"
        self._failing = failing
        self.closed = False

    async def open(self) -> ModelMetadata:
        if self.device.name in self._failing:
            raise RuntimeError(f"{self.device.name} is out of memory")
        return METADATA

    async def aclose(self) -> None:
        self.closed = True

    def statistics(self) -> _Stats:
        return _Stats()


def _runtime_config() -> RuntimeConfig:
    return RuntimeConfig.model_validate(
        {
            "devices": [
                {"name": "cpu_a", "provider": "cpu"},
                {"name": "cpu_b", "provider": "cpu"},
            ],
            "scheduler": {
                "strategies": [
                    {"name": "fallback_chain", "primary": "cpu_a", "fallbacks": ["cpu_b"]}
                ]
            },
        }
    )


async def test_an_instance_that_cannot_start_when_scaling_up_marks_its_device_as_at_load() -> None:
    """Scaling up on a device that cannot start more: the device is skipped from then
    on (``device_unavailable``), as a failed start at load does, and the pool keeps
    the instances it had."""
    clock = VirtualClock()
    events = EventSink()
    placement = Placement(_runtime_config(), clock=clock, events=events)
    failing: set[str] = set()
    made: list[FakeInstance] = []

    def factory(key: ModelKey, index: int, tier: str, device: Device, *rest: Any) -> FakeInstance:
        made.append(FakeInstance(index, device, failing))
        return made[-1]

    pool = InstancePool(
        factory,  # type: ignore[arg-type]
        placement=placement,
        outliers=OutlierDetector(OutlierEjectionConfig(), clock=clock, events=events),
        events=events,
    )
    config = ModelConfig.model_validate({"name": "m", "path": "m.onnx", "backend": "onnxruntime"})
    await pool.load(KEY, Path("m.onnx"), config)
    assert placement.available("cpu_a") and len(pool.model(KEY).instances()) == 2
    failing.add("cpu_a")
    added = await pool.scale(KEY, 1, minimum=1, maximum=4)
    assert added == []
    assert not placement.available("cpu_a")
    (event,) = events.recent("device_unavailable")
    assert event.subject == "device:cpu_a" and "out of memory" in event.cause
    assert [e.subject for e in events.recent("worker_start_failed")] == ["model:m/2"]
    assert made[-1].closed and len(pool.model(KEY).instances()) == 2
