"""Node runtime policy: the ``runtime`` block of a node, at the top level or in a pipeline.

A node is one model of a pipeline with a runtime policy of its own (ModelBox's
spelling, taken from the brief): ``scheduler``, ``memory_pool``, ``priority``,
``timeout`` and ``self_healing``. Top-level ``nodes:`` entries are the nodes of a
pipeline someone else runs (ModelBox calls the served model of each node): the
node's ``model`` is the served model of that name (its own ``name`` when not
given), and its policy is that model's. A ``pipelines[].nodes[]`` entry's
``runtime`` is the same block; its ``priority`` and ``timeout`` are those of the
requests the pipeline sends to the node's model, and the other keys are the model's.

What each key does to the node's model:

- ``scheduler``: ``dynamic_batching`` batches the model dynamically (even where the
  server-wide ``dynamic_batching`` strategy is off) under the server's mode; a mode
  name (``manual``, ``adaptive``, ``auto``, ``hybrid``, ``conservative``,
  ``ultra_low_latency``) is the model's ``scheduler_mode``.
- ``memory_pool``: the most arena bytes the model's requests hold in flight at once
  (a per-model quota, enforced as tenant quotas are: a request over the pool waits up
  to ``memory.quota_wait`` for room, then gets 429; one larger than the whole pool gets
  400). The pools together must fit in the arena (global coordination).
- ``priority``/``timeout`` (top-level nodes): the level and the queue deadline a
  request to the model gets when it names none (the model's Triton
  ``default_priority_level`` and ``default_timeout_microseconds``).
- ``self_healing``: ``true`` applies the runtime's triggers that watch every model to
  this model on its own too (not those of the arena or the machine: fragmentation,
  memory in use, temperature, power) (with none, a default: ``error_rate`` above 5 % for 30 s
  restarts its worker); ``false`` takes the model out of the guardian's sight (its
  figures do not count towards any trigger and no action targets or throttles it);
  ``{triggers: [...]}`` gives the model triggers of its own.

:func:`node_policies` merges the nodes into one :class:`NodePolicy` per model and
refuses contradictions; :func:`guardian_config` is the ``self_healing`` section with
the nodes' triggers applied (what the guardian runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, Field

from sordino.config.base import MAX_POOL_SIZE, Section
from sordino.config.models import MODEL_NAME_PATTERN
from sordino.config.scheduler import SchedulerMode, check_priority
from sordino.config.self_healing import SelfHealingConfig, TriggerConfig
from sordino.config.units import Size

__all__ = [
    "DEFAULT_NODE_TRIGGER",
    "MACHINE_METRICS",
    "NODE_SCHEDULERS",
    "NodePolicy",
    "NodeRuntime",
    "NodeSelfHealing",
    "ServedNode",
    "check_node_triggers",
    "guardian_config",
    "node_policies",
]

NodeScheduler = Literal[
    "dynamic_batching", "auto", "manual", "hybrid", "adaptive", "conservative", "ultra_low_latency"
]
NODE_SCHEDULERS: tuple[str, ...] = get_args(NodeScheduler)
assert set(NODE_SCHEDULERS[1:]) == set(get_args(SchedulerMode))  # one list of modes

DEFAULT_NODE_TRIGGER: dict[str, object] = {
    "metric": "error_rate",
    "threshold": "5%",
    "window": "30s",
    "action": "restart_worker",
}
"""What ``self_healing: true`` gives a node when the runtime lists no trigger of its own."""

MACHINE_METRICS = frozenset(
    {"memory_fragmentation", "memory_in_use", "device_temperature", "power"}
)
"""Metrics of the arena or the machine, not of a model: a node's copy of such a trigger
would only act twice on the same thing, so ``self_healing: true`` does not copy them."""


def _check_scheduler(value: object) -> object:
    if value is None or value in NODE_SCHEDULERS:
        return value
    raise ValueError(
        f"unknown node scheduler {value!r}; use one of: {', '.join(NODE_SCHEDULERS)} "
        "(dynamic_batching: the model's dynamic batcher under scheduler.mode; the others "
        "are scheduler modes)"
    )


class NodeSelfHealing(Section):
    """A node's own guardian policy: ``self_healing: {triggers: [...]}``."""

    enabled: bool = True
    """False: the guardian leaves the node's model alone (as ``self_healing: false``)."""
    triggers: tuple[TriggerConfig, ...] = ()
    """The node's own triggers, each scoped to the node's model; none: as ``true``."""


def _self_healing(value: object) -> object:
    if isinstance(value, bool):
        return NodeSelfHealing(enabled=value)
    return value


class NodeRuntime(Section):
    """A node's own policy (see the module docstring for what each key does)."""

    priority: Annotated[
        int | Literal["high", "normal", "low"] | None, BeforeValidator(check_priority)
    ] = None
    """The priority of the node's requests (None: the model's default level)."""
    scheduler: Annotated[NodeScheduler | None, BeforeValidator(_check_scheduler)] = None
    """How the node's model is scheduled; None: as the model is configured."""
    timeout: float | None = Field(default=None, gt=0)
    """Seconds the node's request may wait in its model's queue (its deadline)."""
    memory_pool: Size | None = Field(default=None, gt=0, le=MAX_POOL_SIZE)
    """The most arena bytes the node's model holds in flight at once."""
    self_healing: Annotated[NodeSelfHealing | None, BeforeValidator(_self_healing)] = None
    """true, false, or ``{triggers: [...]}``; None: as any model."""


class ServedNode(Section):
    """A top-level ``nodes:`` entry: the runtime policy of one served model."""

    name: str = Field(pattern=MODEL_NAME_PATTERN)
    model: str | None = Field(default=None, pattern=MODEL_NAME_PATTERN)
    """The served model this node runs; None: the model called ``name``."""
    runtime: NodeRuntime = NodeRuntime()

    @property
    def model_name(self) -> str:
        return self.model or self.name


@dataclass(frozen=True, slots=True)
class NodePolicy:
    """What the nodes that run one model ask of it (merged over every node)."""

    model: str
    node: str
    """The node that names it (the first, for messages)."""
    scheduler: str | None = None
    memory_pool: int | None = None
    self_healing: NodeSelfHealing | None = None
    priority: int | str | None = None
    """Top-level nodes only: the model's default level."""
    timeout: float | None = None
    """Top-level nodes only: the model's default queue deadline (seconds)."""


def node_policies(
    served: Iterable[ServedNode], pipelines: Iterable[tuple[str, Iterable[Any]]]
) -> dict[str, NodePolicy]:
    """One policy per model named by a node; ValueError when two nodes contradict.

    ``pipelines`` is ``(pipeline name, its NodeConfig entries)``.
    """
    policies: dict[str, NodePolicy] = {}
    where: dict[str, str] = {}
    for node in served:
        model = node.model_name
        if model in policies:
            raise ValueError(
                f"nodes: {where[model]} and node {node.name!r} both run model {model!r}; "
                "give each model one node"
            )
        runtime = node.runtime
        policies[model] = NodePolicy(
            model,
            node.name,
            runtime.scheduler,
            runtime.memory_pool,
            runtime.self_healing,
            runtime.priority,
            runtime.timeout,
        )
        where[model] = f"node {node.name!r}"
    for pipeline, nodes in pipelines:
        for node in nodes:
            step: NodeRuntime = node.runtime
            here = f"pipeline {pipeline}, node {node.name!r}"
            old = policies.get(node.model)
            if old is None:
                policies[node.model] = NodePolicy(
                    node.model,
                    node.name,
                    step.scheduler,
                    step.memory_pool,
                    step.self_healing,
                )
                where[node.model] = here
                continue
            merged = {}
            for key in ("scheduler", "memory_pool", "self_healing"):
                mine, theirs = getattr(step, key), getattr(old, key)
                if mine is not None and theirs is not None and mine != theirs:
                    raise ValueError(
                        f"{here} and {where[node.model]} both run model {node.model!r} with "
                        f"different {key} ({_shown(mine)} and {_shown(theirs)}); the model has "
                        "one: give it in one node, or the same in both"
                    )
                merged[key] = theirs if theirs is not None else mine
            policies[node.model] = NodePolicy(
                node.model,
                old.node,
                merged["scheduler"],
                merged["memory_pool"],
                merged["self_healing"],
                old.priority,
                old.timeout,
            )
    return policies


def _shown(value: object) -> str:
    if isinstance(value, NodeSelfHealing):
        return "a triggers block" if value.triggers else str(value.enabled).lower()
    return repr(value)


def check_node_triggers(policies: Mapping[str, NodePolicy], healing: SelfHealingConfig) -> None:
    """ValueError for a node's trigger on another model, or a trigger on an excluded model."""
    excluded = {m for m, p in policies.items() if p.self_healing and not p.self_healing.enabled}
    for model, policy in policies.items():
        for trigger in policy.self_healing.triggers if policy.self_healing else ():
            if trigger.model not in (None, model):
                raise ValueError(
                    f"node {policy.node!r}: its self_healing trigger '{trigger.name}' watches "
                    f"model {trigger.model}, but the node runs {model}; leave model out"
                )
    for trigger in healing.triggers:
        if trigger.model in excluded:
            raise ValueError(
                f"self_healing: the trigger '{trigger.name}' watches model {trigger.model}, "
                f"but node {policies[trigger.model].node!r} says self_healing: false for it; "
                "remove one of them"
            )


def guardian_config(
    healing: SelfHealingConfig, policies: Mapping[str, NodePolicy]
) -> SelfHealingConfig:
    """``healing`` with the nodes' ``self_healing`` applied (what the guardian runs).

    A node with ``true`` adds a copy of every trigger that watches every model (but
    not a :data:`MACHINE_METRICS` one), scoped to its model (or
    :data:`DEFAULT_NODE_TRIGGER` when there is none); one with
    triggers adds them, scoped; one with ``false`` lists its model in
    ``exclude_models``. Node triggers turn the guardian on unless ``enabled`` was
    given (``enabled: false``, ``--guardian-mode false`` keep it off).
    """
    added: list[TriggerConfig] = []
    excluded = list(healing.exclude_models)
    for model, policy in sorted(policies.items()):
        own = policy.self_healing
        if own is None:
            continue
        if not own.enabled:
            excluded.append(model)
            continue
        if own.triggers:
            added += [t.model_copy(update={"model": model}) for t in own.triggers]
            continue
        everywhere = [
            t for t in healing.triggers if t.model is None and t.metric not in MACHINE_METRICS
        ]
        if not everywhere:
            everywhere = [TriggerConfig.model_validate(DEFAULT_NODE_TRIGGER)]
        added += [t.model_copy(update={"model": model}) for t in everywhere]
    if not added and excluded == list(healing.exclude_models):
        return healing
    enabled = healing.enabled or ("enabled" not in healing.model_fields_set and bool(added))
    return healing.model_copy(
        update={
            "triggers": (*healing.triggers, *added),
            "exclude_models": tuple(dict.fromkeys(excluded)),
            "enabled": enabled,
        }
    )
