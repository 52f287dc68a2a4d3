"""Progressive recovery: a ramping instance takes its share of the batches, no more."""

from __future__ import annotations

from sordino.execution.devices import Device
from sordino.execution.instances import ThreadInstance
from sordino.execution.placement import PlacedModel, Signal, TierSlot, choose
from sordino.inference import ModelKey, ModelMetadata

KEY = ModelKey("m", "1")


def _instance(index: int) -> ThreadInstance:
    instance = ThreadInstance(
        KEY,
        index,
        "cpu",
        Device("cpu", ("CPUExecutionProvider",), None, 1),
        "m.onnx",
        backend="onnxruntime",
    )
    instance.state = "ready"
    return instance


async def test_a_ramping_instance_takes_its_share_of_batches() -> None:
    """At share 0.1 the new instance runs 1 batch in 10; at 1.0 it is an equal again."""
    old, new = _instance(0), _instance(1)
    model = PlacedModel(
        KEY,
        "thread",
        ModelMetadata("m", "1", "onnx", (), (), batched=True),
        [TierSlot("cpu", None, [old, new])],
        Signal(),
    )
    new.share = 0.1
    picks = []
    for _ in range(100):
        choice = await choose(model, set(), set())
        assert choice is not None
        picks.append(choice[1].index)
        choice[1].busy = False
    assert picks.count(1) == 10
    new.share = 1.0
    choice = await choose(model, set(), set())
    assert choice is not None and choice[1].index == 0  # equals again: the first idle one
