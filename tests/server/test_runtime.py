"""Runtime without HTTP: loading, modes that measure the model, versions, shutdown."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import numpy as np
import psutil
import pytest

from sordino.config import validate_config
from sordino.errors import ModelLoadError, NotFound, ShuttingDown
from sordino.inference import InferRequest, ModelKey
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


def _two_models() -> list:  # type: ignore[type-arg]
    return [s for s in builtin_sources() if s.name in ("digits-classifier", "simple")]


async def test_models_start_together_and_serve_in_the_order_given() -> None:
    """Every model's workers start before the first model is served (they start
    concurrently); warm-up and registration then go in the order given."""
    sources = list(reversed(_two_models()))  # simple first: not the built-in order
    runtime = Runtime(validate_config({}), sources)
    served: list[str] = []
    await runtime.start(on_loaded=lambda model: served.append(model.key.name))
    try:
        names = [s.name for s in sources]
        assert served == names
        kinds = [
            e.kind for e in runtime.events.recent() if e.kind in ("worker_started", "model_loaded")
        ]
        assert kinds == ["worker_started"] * 2 + ["model_loaded"] * 2
        loaded = [e.subject for e in runtime.events.recent("model_loaded")]
        assert loaded == [f"{name}/1" for name in names]
    finally:
        await runtime.stop()


async def test_a_model_that_fails_to_start_is_named_and_the_others_stop(tmp_path: Path) -> None:
    digits, simple = _two_models()
    broken = replace(digits, name="broken", path=tmp_path / "not-a-model.onnx")
    broken.path.write_bytes(b"not onnx")
    runtime = Runtime(validate_config({}), [digits, broken, simple])
    with pytest.raises(ModelLoadError, match="model broken/1"):
        await runtime.start()
    try:
        pids = [e.payload["pid"] for e in runtime.events.recent("worker_started")]
        assert runtime.models() == []
        assert all(
            runtime.executor.instances(ModelKey(m.name, m.version)) == 0 for m in (digits, simple)
        )
        for pid in pids:  # the started models' workers were stopped, not left running
            assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    finally:
        await runtime.stop()


async def test_a_source_given_twice_is_refused_before_anything_starts() -> None:
    digits = _digits_only()[0]
    runtime = Runtime(validate_config({}), [digits, digits])
    with pytest.raises(ModelLoadError, match="digits-classifier version 1 is given twice"):
        await runtime.start()
    assert runtime.events.recent("worker_started") == []
    await runtime.stop()
