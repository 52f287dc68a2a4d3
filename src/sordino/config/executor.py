"""The ``executor`` section and a model's ``ray`` options: where model instances run.

``executor.kind: process`` (the default) runs each instance in a worker process on
this machine; ``kind: ray`` runs each as a Ray actor on a Ray cluster
(``execution/ray_executor.py``, docs/scale-out.md). A model's ``ray:`` block says
what Ray schedules each of its actors with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from sordino.config.base import Section

__all__ = ["DEFAULT_NUM_CPUS", "ExecutorConfig", "RayModelOptions"]

DEFAULT_NUM_CPUS = 0.25
"""What Ray reserves for an actor without ``ray.num_cpus``: a model instance mostly
waits for batches, and a whole CPU each left a 2-CPU cluster unable to hold the
built-in models (issue 27)."""


class ExecutorConfig(Section):
    """Where model instances run: worker processes here, or actors on a Ray cluster."""

    kind: Literal["process", "ray"] = "process"
    """process: worker processes on this machine; ray: Ray actors (pip install 'sordino[ray]')."""
    address: str | None = None
    """The Ray cluster for ``kind: ray``: ``auto`` (the one ``ray start`` began on this
    machine), ``ray://host:10001`` or ``host:6379``; None starts a private local one."""
    namespace: str = Field(default="sordino", min_length=1)
    """The Ray namespace the actors are created in."""
    node_pool: bool = True
    """kind: ray: each node gets a shared-memory pool managed like the arena (``memory:``
    strategy, size, per-node tenant quotas; figures per node); false: batches only go
    through Ray's object store and ``memory.quotas`` are charged at admission."""

    @field_validator("address")
    @classmethod
    def _address_not_blank(cls, address: str | None) -> str | None:
        if address is not None and not address.strip():
            raise ValueError("address is empty; give auto, host:port or ray://host:port")
        return address

    @model_validator(mode="after")
    def _address_needs_ray(self) -> ExecutorConfig:
        if self.address is not None and self.kind != "ray":
            raise ValueError(
                f"address {self.address!r} is a Ray cluster's, but kind is {self.kind}: "
                "set kind: ray (--executor ray) or remove the address"
            )
        return self


class RayModelOptions(Section):
    """How Ray schedules each actor (instance) of one model (``kind: ray`` only)."""

    num_cpus: float = Field(default=DEFAULT_NUM_CPUS, ge=0)
    """CPUs Ray reserves for each actor: a quarter by default, so that a small cluster
    holds every model (an actor's ONNX Runtime threads are not limited by it)."""
    num_gpus: float = Field(default=0.0, ge=0)
    """GPUs Ray reserves for each actor (fractions share a GPU)."""
    resources: Mapping[str, Annotated[float, Field(ge=0)]] = Field(default_factory=dict)
    """Custom Ray resources each actor needs, e.g. ``{accelerator_h200: 1}``."""
    placement: Literal["default", "spread", "pack"] = "default"
    """default: Ray's scheduler decides; spread: actors on as many nodes as possible;
    pack: actors in one placement group packed onto as few nodes as possible."""

    @field_validator("resources")
    @classmethod
    def _custom_only(cls, resources: Mapping[str, float]) -> Mapping[str, float]:
        builtin = sorted(set(resources) & {"CPU", "GPU", "memory", "object_store_memory"})
        if builtin:
            raise ValueError(
                f"resources {builtin} are Ray's own; use num_cpus / num_gpus instead, "
                "and resources only for custom ones"
            )
        return dict(resources)
