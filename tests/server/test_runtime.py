"""Runtime without HTTP: loading, modes that measure the model, versions, shutdown."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from sordino.config import validate_config
from sordino.errors import NotFound, ShuttingDown
from sordino.inference import InferRequest
from sordino.models.repository import builtin_sources
from sordino.server.runtime import Runtime


def _digits_only() -> list:  # type: ignore[type-arg]
    return [s for s in builtin_sources() if s.name == "digits-classifier"]


def _request(rows: int = 1) -> InferRequest:
    return InferRequest(
        model="digits-classifier", inputs={"pixels": np.ones((rows, 64), dtype=np.float32)}
    )


@pytest.mark.parametrize("mode", ["auto", "hybrid"])
async def test_measuring_modes_record_the_batch_curve(mode: str) -> None:
    runtime = Runtime(validate_config({"scheduler": {"mode": mode}}), _digits_only())
    await runtime.start()
    model = runtime.get("digits-classifier")
    assert model.curve is not None
    assert model.curve.sizes[0] == 1 and model.curve.sizes[-1] == 32
    effective = model.scheduler.statistics().controller.effective_mode
    assert effective in ("adaptive", "ultra_low_latency")
    response = await runtime.infer(_request())
    assert response.outputs["probabilities"].shape == (1, 10)
    await runtime.stop()


async def test_every_mode_serves() -> None:
    for mode in ("manual", "conservative", "ultra_low_latency", "adaptive"):
        runtime = Runtime(validate_config({"scheduler": {"mode": mode}}), _digits_only())
        await runtime.start()
        results = await asyncio.gather(*(runtime.infer(_request()) for _ in range(20)))
        assert all(r.outputs["probabilities"].shape == (1, 10) for r in results)
        stats = runtime.scheduler_statistics()[0]
        assert stats.succeeded == 20
        await runtime.stop()


async def test_events_record_loading() -> None:
    runtime = Runtime(validate_config({}), _digits_only())
    await runtime.start()
    loaded = runtime.events.recent("model_loaded")
    assert [e.subject for e in loaded] == ["digits-classifier/1"]
    assert loaded[0].payload["mode"] == "adaptive"
    await runtime.stop()
    assert runtime.events.recent("server_stopped")


async def test_stopped_runtime_refuses_and_unloads() -> None:
    runtime = Runtime(validate_config({}), _digits_only())
    await runtime.start()
    assert runtime.ready
    await runtime.stop()
    assert not runtime.ready
    with pytest.raises(ShuttingDown):
        await runtime.infer(_request())
    assert runtime.models() == []


async def test_unknown_model_names_the_loaded_ones() -> None:
    runtime = Runtime(validate_config({}), _digits_only())
    await runtime.start()
    with pytest.raises(NotFound, match="digits-classifier"):
        runtime.get("nope")
    await runtime.stop()
