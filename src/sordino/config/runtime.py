"""The root of the configuration: :class:`RuntimeConfig` composes every section.

Checks that span sections live here: poll mode needs a model repository, explicit
models and devices have distinct names. A fallback chain may name devices that are not
declared under ``devices``; ``sordino.execution.devices`` resolves those by their name
(``cpu*`` is the CPU, any other name the next accelerator present).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field, field_validator, model_validator

from sordino.config.base import ExpandedPath, Section, reject_repeated_names
from sordino.config.devices import DeviceConfig
from sordino.config.executor import ExecutorConfig
from sordino.config.memory import MemoryConfig, QuotaConfig
from sordino.config.models import ModelConfig
from sordino.config.nodes import (
    NodePolicy,
    ServedNode,
    check_node_triggers,
    guardian_config,
    node_policies,
)
from sordino.config.pipelines import PipelineConfig
from sordino.config.quant_guard import QuantGuardConfig
from sordino.config.reconfigure import ReconfigureConfig
from sordino.config.scheduler import SchedulerConfig
from sordino.config.self_healing import SelfHealingConfig
from sordino.config.server import ServerConfig
from sordino.config.telemetry import TelemetryConfig
from sordino.config.tenants import AuthConfig, TenantConfig
from sordino.config.workers import WorkersConfig

__all__ = ["RuntimeConfig"]


def _named_with_path(model: ModelConfig) -> ModelConfig:
    missing = [key for key in ("name", "path") if getattr(model, key) is None]
    if missing:
        raise ValueError(f"an entry of models needs {' and '.join(missing)}")
    return model


class RuntimeConfig(Section):
    """Everything sordino reads at start-up; one immutable snapshot."""

    server: ServerConfig = Field(default_factory=ServerConfig)
    """The front door; built when a config is, so ``data_dir`` follows ``$HOME`` then."""
    devices: tuple[DeviceConfig, ...] = ()
    """Named devices a ``fallback_chain`` strategy chains together; a chain may also name
    undeclared devices, resolved by name (``cpu*``: the CPU; else the next accelerator)."""
    scheduler: SchedulerConfig = SchedulerConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    models: tuple[Annotated[ModelConfig, AfterValidator(_named_with_path)], ...] = ()
    """Explicitly listed models; each needs ``name`` and ``path``."""
    model_repository: ExpandedPath | tuple[ExpandedPath, ...] | None = None
    """A Triton-style folder with one sub-folder per model, or several (their models
    together, as Triton's ``--model-repository`` given more than once)."""
    workers: WorkersConfig = WorkersConfig()
    memory: MemoryConfig = MemoryConfig()
    """The shared-memory arena's manager (docs/memory.md)."""
    self_healing: SelfHealingConfig = SelfHealingConfig()
    """The guardian: triggers, actions, budget, recovery, alert channels."""
    tenants: tuple[TenantConfig, ...] = ()
    """Tenants: API keys, weights, rates, concurrency, memory quotas (docs/tenants.md)."""
    auth: AuthConfig = AuthConfig()
    """Whether a key is required, and the admin keys (docs/security.md)."""

    @model_validator(mode="after")
    def _tenants_coherent(self) -> RuntimeConfig:
        reject_repeated_names((t.name for t in self.tenants), what="tenant names")
        owners: dict[str, str] = {key: "auth.admin_keys" for key in self.auth.admin_keys}
        for tenant in self.tenants:
            for key in tenant.keys:
                if key in owners:
                    raise ValueError(
                        f"tenants: key {key[:15]}… of tenant {tenant.name!r} is also in "
                        f"{owners[key]}; each key belongs to one tenant or to the admins"
                    )
                owners[key] = f"tenant {tenant.name!r}"
            if tenant.memory_quota is not None and self.memory.quota(tenant.name) is not None:
                raise ValueError(
                    f"tenant {tenant.name!r} has a memory_quota and an entry in memory.quotas; "
                    "keep one of them"
                )
            if tenant.memory_quota is not None and not self.memory.enabled:
                raise ValueError(
                    f"tenant {tenant.name!r} has a memory_quota, but memory.enabled is false: "
                    "enable the memory manager or remove the quota"
                )
        return self

    @property
    def memory_with_tenant_quotas(self) -> MemoryConfig:
        """``memory`` with each tenant's ``memory_quota`` added to ``memory.quotas``."""
        extra = tuple(
            QuotaConfig(tenant=t.name, max=t.memory_quota)
            for t in self.tenants
            if t.memory_quota is not None
        )
        if not extra:
            return self.memory
        return self.memory.model_copy(update={"quotas": self.memory.quotas + extra})

    reconfigure: ReconfigureConfig = ReconfigureConfig()
    """Hot reconfiguration: the verify window and rollback (docs/operations.md)."""
    quant_guard: QuantGuardConfig = QuantGuardConfig()
    """Quantization-aware loading: the accuracy guard of int8 models (docs/operations.md)."""
    pipelines: tuple[PipelineConfig, ...] = ()
    """Models chained into one served model, each node with its own policy."""

    @field_validator("pipelines")
    @classmethod
    def _pipeline_names_unique(
        cls, pipelines: tuple[PipelineConfig, ...]
    ) -> tuple[PipelineConfig, ...]:
        reject_repeated_names((p.name for p in pipelines), what="pipeline names")
        return pipelines

    executor: ExecutorConfig = ExecutorConfig()
    """Where model instances run: worker processes here, or Ray actors (docs/scale-out.md)."""
    nodes: tuple[ServedNode, ...] = ()
    """Pipeline nodes run elsewhere (ModelBox): each one's runtime policy is that of the
    served model it names (``config/nodes.py``, docs/operations.md)."""

    @model_validator(mode="after")
    def _nodes_coherent(self) -> RuntimeConfig:
        reject_repeated_names((node.name for node in self.nodes), what="node names")
        policies = self.node_policies
        check_node_triggers(policies, self.self_healing)
        pools = {m: p for m, p in policies.items() if p.memory_pool is not None}
        if pools and not self.memory.enabled:
            raise ValueError(
                "nodes: a node's memory_pool needs the memory manager, but memory.enabled is "
                "false (--disable-memory-pool): enable it or remove the memory_pool"
            )
        total = sum(p.memory_pool or 0 for p in pools.values())
        arena, what = self.arena_bytes
        if total > arena:
            each = ", ".join(f"{p.node} {_size(p.memory_pool or 0)}" for p in pools.values())
            raise ValueError(
                f"nodes: the nodes' memory pools add up to {_size(total)} ({each}), more than "
                f"the arena's {_size(arena)} ({what}); the pools share the arena: raise "
                "memory.pool_size or shrink the pools"
            )
        return self

    @property
    def arena_bytes(self) -> tuple[int, str]:
        """The arena's size (its largest, for pool_size auto) and the setting that gives it."""
        pool = self.memory.pool_size
        if pool == "auto":
            return self.memory.pool_max, "memory.pool_max, with pool_size auto"
        if isinstance(pool, int):
            return pool, "memory.pool_size"
        return self.workers.shared_memory, "workers.shared_memory; memory.pool_size unset"

    @property
    def node_policies(self) -> dict[str, NodePolicy]:
        """The runtime policy of each model a node names (top level and pipelines)."""
        return node_policies(self.nodes, ((p.name, p.nodes) for p in self.pipelines))

    @property
    def guardian(self) -> SelfHealingConfig:
        """``self_healing`` with the nodes' own ``self_healing`` applied: what the guardian
        runs (``config/nodes.py``)."""
        return guardian_config(self.self_healing, self.node_policies)

    @model_validator(mode="after")
    def _ray_options_need_ray(self) -> RuntimeConfig:
        for model in self.models:
            if model.ray is not None and self.executor.kind != "ray":
                raise ValueError(
                    f"model {model.name} has ray options, but executor.kind is "
                    f"{self.executor.kind}: set executor.kind: ray (--executor ray) or remove "
                    "the model's ray block"
                )
            if self.executor.kind == "ray" and model.isolation == "thread":
                raise ValueError(
                    f"model {model.name} has isolation: thread, which runs inside the server; "
                    "with executor.kind: ray every instance is a Ray actor: remove isolation"
                )
        return self

    @property
    def repositories(self) -> tuple[Path, ...]:
        """Every model repository given, in order (none: empty)."""
        given = self.model_repository
        if given is None:
            return ()
        return given if isinstance(given, tuple) else (given,)

    @model_validator(mode="after")
    def _poll_needs_repository(self) -> RuntimeConfig:
        if self.server.model_control_mode == "poll" and self.model_repository is None:
            # A check across sections: the message names its own location (see loader).
            raise ValueError(
                "server.model_control_mode: poll rescans a model repository, but none is "
                "given: pass --model-repository DIR (model_repository in a config file), "
                "or use the mode explicit"
            )
        return self

    @field_validator("models")
    @classmethod
    def _names_unique(cls, models: tuple[ModelConfig, ...]) -> tuple[ModelConfig, ...]:
        # Every entry has a name by now: _named_with_path refused those without one.
        reject_repeated_names((str(model.name) for model in models), what="model names")
        return models

    @field_validator("devices")
    @classmethod
    def _device_names_unique(cls, devices: tuple[DeviceConfig, ...]) -> tuple[DeviceConfig, ...]:
        reject_repeated_names((device.name for device in devices), what="device names")
        return devices

    def device(self, name: str) -> DeviceConfig | None:
        """The device declared as ``name`` under ``devices``, or None when it is not declared
        (a fallback chain may name it anyway; see ``sordino.execution.devices``)."""
        for device in self.devices:
            if device.name == name:
                return device
        return None


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if nbytes >= scale:
            return f"{nbytes / scale:.4g} {unit}"
    return f"{nbytes} bytes"
