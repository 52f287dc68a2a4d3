"""Two loads of one model version up at once (a reload: the new one warms up beside the
one serving): each runs its own batches on its own worker processes, the statistics
show the version once, and unloading one leaves the other whole."""

from __future__ import annotations

import numpy as np

from sordino.config import ModelConfig, RuntimeConfig
from sordino.events import EventSink
from sordino.execution.chain import ChainExecutor
from sordino.inference import ModelKey
from sordino.memory.refs import Tensors
from sordino.models.repository import builtin_sources
from sordino.testing import VirtualClock

SOURCE = next(s for s in builtin_sources() if s.name == "digits-classifier")
OLD = ModelKey(SOURCE.name, SOURCE.version)
NEW = ModelKey(SOURCE.name, SOURCE.version, generation=1)
ROWS = np.random.default_rng(0).random((2, 64), dtype=np.float32)


def _config(instances: int) -> ModelConfig:
    return ModelConfig.model_validate({**SOURCE.config.model_dump(), "instance_count": instances})


async def _runs(executor: ChainExecutor, key: ModelKey) -> bool:
    outputs = await executor.run(key, [Tensors.of({"pixels": ROWS})])
    try:
        return bool(np.isfinite(np.asarray(outputs["probabilities"])).all())
    finally:
        outputs.release()


async def test_two_generations_of_a_version_run_apart_and_are_shown_once() -> None:
    executor = ChainExecutor(RuntimeConfig(), clock=VirtualClock(), events=EventSink())
    await executor.load(OLD, SOURCE.path, _config(1))
    try:
        await executor.load(NEW, SOURCE.path, _config(2))
        old_pids = {i.statistics().pid for i in executor._pool.model(OLD).instances()}
        new_pids = {i.statistics().pid for i in executor._pool.model(NEW).instances()}
        assert len(old_pids) == 1 and len(new_pids) == 2 and not old_pids & new_pids
        assert executor.instances(OLD) == 1 and executor.instances(NEW) == 2
        assert await _runs(executor, OLD) and await _runs(executor, NEW)
        # Statistics name instances (model, version, index): the first load's only,
        # until it is gone (two rows of one name would be one series twice in /metrics).
        shown = [(w.model, w.version, w.index, w.pid) for w in executor.statistics().workers]
        assert shown == [(OLD.name, OLD.version, 0, next(iter(old_pids)))]
        assert len(executor.worker_memory()) == 1
        assert executor.find_model(OLD.name) is not None
        assert executor.find_model(OLD.name).generation == 1  # type: ignore[union-attr]
        await executor.unload(OLD)
        assert executor.instances(OLD) == 0
        assert executor.instances(NEW) == 2 and await _runs(executor, NEW)
        assert sorted(w.pid for w in executor.statistics().workers) == sorted(new_pids)
    finally:
        await executor.aclose()
