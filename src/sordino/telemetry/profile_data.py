"""Per-operator time breakdowns, parsed from ONNX Runtime's profiler output.

ONNX Runtime writes a Chrome-trace JSON list; each executed graph node appears as
an event of category ``Node`` named ``<node>_kernel_time`` with the operator type
in ``args.op_name``. GPU providers traced through CUPTI add ``Kernel`` events, one
per device kernel launch; CPU providers have none, so their launch count is None.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["OperatorProfile", "OperatorTime", "parse_ort_profile"]


@dataclass(frozen=True, slots=True)
class OperatorTime:
    """Time spent in one operator type (or one node) over the profiled batches."""

    op: str
    total_ms: float
    calls: int
    share: float
    provider: str


@dataclass(frozen=True, slots=True)
class OperatorProfile:
    """The result of profiling one model for a while.

    ``lost`` names the instances whose trace was lost in the window (``"model/N:
    cause"``, e.g. a worker killed); the figures cover the other instances.
    """

    model: str
    version: str
    started_at: float
    seconds: float
    batches: int
    synthetic: bool
    total_ms: float
    operators: tuple[OperatorTime, ...]
    nodes: tuple[OperatorTime, ...]
    kernel_launches: int | None
    lost: tuple[str, ...] = ()

    def top(self, n: int = 10) -> tuple[OperatorTime, ...]:
        return self.operators[:n]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OperatorProfile:
        values = dict(data)
        values["operators"] = tuple(OperatorTime(**o) for o in data["operators"])
        values["nodes"] = tuple(OperatorTime(**o) for o in data["nodes"])
        values["lost"] = tuple(data.get("lost", ()))
        return cls(**values)


def _ranked(totals: dict[str, list[Any]], grand_total_us: float) -> tuple[OperatorTime, ...]:
    ranked = sorted(totals.items(), key=lambda kv: -kv[1][0])
    return tuple(
        OperatorTime(
            op=name,
            total_ms=us / 1000,
            calls=calls,
            share=us / grand_total_us if grand_total_us else 0.0,
            provider=provider,
        )
        for name, (us, calls, provider) in ranked
    )


def parse_ort_profile(
    traces: Iterable[list[dict[str, Any]]],
    *,
    model: str,
    version: str,
    started_at: float,
    seconds: float,
    batches: int,
    synthetic: bool,
    lost: tuple[str, ...] = (),
) -> OperatorProfile:
    """Sum the node events of one or more ONNX Runtime profile files by operator type."""
    by_op: dict[str, list[Any]] = {}
    by_node: dict[str, list[Any]] = {}
    kernels = 0
    for trace in traces:
        for event in trace:
            category = event.get("cat")
            if category == "Kernel":
                kernels += 1
                continue
            if category != "Node" or not str(event.get("name", "")).endswith("_kernel_time"):
                continue
            args = event.get("args", {})
            op = str(args.get("op_name", "?"))
            provider = str(args.get("provider", ""))
            node = str(event["name"])[: -len("_kernel_time")]
            dur = float(event.get("dur", 0))
            for table, key in ((by_op, op), (by_node, node)):
                entry = table.setdefault(key, [0.0, 0, provider])
                entry[0] += dur
                entry[1] += 1
    total_us = sum(entry[0] for entry in by_op.values())
    return OperatorProfile(
        model=model,
        version=version,
        started_at=started_at,
        seconds=seconds,
        batches=batches,
        synthetic=synthetic,
        total_ms=total_us / 1000,
        operators=_ranked(by_op, total_us),
        nodes=_ranked(by_node, total_us)[:20],
        kernel_launches=kernels or None,
        lost=lost,
    )
