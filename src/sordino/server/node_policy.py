"""The runtime policy of a pipeline's node, checked against the model it runs (at load)."""

from __future__ import annotations

from sordino.config import RuntimeConfig
from sordino.config.nodes import NodePolicy
from sordino.errors import ModelLoadError
from sordino.models.repository import ModelSource

__all__ = ["node_policy"]


def node_policy(config: RuntimeConfig, source: ModelSource, *, batched: bool) -> NodePolicy | None:
    """The runtime policy of the node that runs ``source``'s model, checked against it.

    Raises :class:`ModelLoadError` when the node asks what the model cannot do: dynamic
    batching of a model that does not batch, a mode other than the model's own
    ``scheduler_mode``, a priority level the model's queue does not have.
    """
    node = config.node_policies.get(source.name)
    if node is None:
        return None
    where = f"node {node.node} (model {source.name})"
    model = source.config
    if node.scheduler == "dynamic_batching" and (not batched or model.max_batch_size == 0):
        raise ModelLoadError(
            f"{where}: scheduler dynamic_batching, but the model does not batch (no variable "
            "first dimension, or max_batch_size 0); give the node a scheduler mode such as "
            "ultra_low_latency, or leave scheduler out"
        )
    own = model.scheduler_mode
    if node.scheduler not in (None, "dynamic_batching") and own not in (None, node.scheduler):
        raise ModelLoadError(
            f"{where}: scheduler {node.scheduler}, but the model's scheduler_mode is {own}; "
            "keep one of them"
        )
    levels = model.dynamic_batching.priority_levels
    if isinstance(node.priority, int) and node.priority > levels:
        raise ModelLoadError(
            f"{where}: priority {node.priority} is outside the model's priority levels "
            f"1..{levels} (1 is highest)"
        )
    return node
