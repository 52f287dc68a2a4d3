"""The shared records: what the parts of the runtime report, and who listens.

Every stateful part has ``statistics()`` returning a frozen record; telemetry exports
these, the guardian will judge by them, and the monitor and dashboard show them. The
records live here, at the bottom of the import graph (beside ``inference.py``), so
that telemetry depends on records and events only, never on the scheduling,
execution or memory layers that produce them (``tests/test_layers.py`` enforces
this). A part imports its own record from here; nothing here imports a layer.

One module per family: ``scheduling.py`` (the queue policy, the scheduler's figures
and its observer), ``execution.py`` (instances, breakers, switches, outliers),
``memory.py`` (the arena, the memory manager, node pools, compaction),
``guardian.py`` (triggers and the action budget) and ``serving.py`` (connections,
tenants, pipelines). Import the records from ``sordino.records``.
"""

from __future__ import annotations

from sordino.records.execution import (
    BreakerState,
    BreakerStatistics,
    DeviceStatistics,
    ExecutionStatistics,
    InstanceState,
    OutlierStatistics,
    SwitchStatistics,
    WorkerStatistics,
)
from sordino.records.guardian import (
    GuardianStatistics,
    TriggerStatistics,
)
from sordino.records.memory import (
    ArenaStatistics,
    CompactionStatistics,
    CompactionStep,
    DefragReport,
    MemoryForecast,
    MemoryStatistics,
    NodeMemoryStatistics,
    OwnerStatistics,
    PoolStatistics,
    ResizeReport,
    StepPlanStatistics,
    TierStatistics,
    WorkerMemory,
)
from sordino.records.scheduling import (
    BatchDone,
    ControllerStatistics,
    LevelQueue,
    Outcome,
    QueueSettings,
    QueueStatistics,
    RequestDone,
    SchedulerObserver,
    SchedulerStatistics,
)
from sordino.records.serving import (
    CacheFigures,
    ConnectionStatistics,
    PipelineStatistics,
    TenantStatistics,
)

__all__ = [
    "ArenaStatistics",
    "BatchDone",
    "BreakerState",
    "BreakerStatistics",
    "CacheFigures",
    "CompactionStatistics",
    "CompactionStep",
    "ConnectionStatistics",
    "ControllerStatistics",
    "DefragReport",
    "DeviceStatistics",
    "ExecutionStatistics",
    "GuardianStatistics",
    "InstanceState",
    "LevelQueue",
    "MemoryForecast",
    "MemoryStatistics",
    "NodeMemoryStatistics",
    "Outcome",
    "OutlierStatistics",
    "OwnerStatistics",
    "PipelineStatistics",
    "PoolStatistics",
    "QueueSettings",
    "QueueStatistics",
    "RequestDone",
    "ResizeReport",
    "SchedulerObserver",
    "SchedulerStatistics",
    "StepPlanStatistics",
    "SwitchStatistics",
    "TenantStatistics",
    "TierStatistics",
    "TriggerStatistics",
    "WorkerMemory",
    "WorkerStatistics",
]
