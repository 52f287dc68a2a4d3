"""The statistics records of the execution layer (what telemetry exports): device
switches, and each worker process's memory."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable

import psutil

from sordino.config.memory import FrameworkMemoryConfig
from sordino.execution.instances import ProcessInstance
from sordino.execution.placement import Instance
from sordino.records import SwitchStatistics, WorkerMemory

__all__ = ["SwitchRecorder", "worker_memory"]


class SwitchRecorder:
    """Counts and times device switches per (model, from, to)."""

    def __init__(self) -> None:
        self._data: dict[tuple[str, str, str], list[float]] = {}

    def record(
        self, model: str, source: str, target: str, switch_s: float, dispatch_s: float
    ) -> None:
        entry = self._data.setdefault((model, source, target), [0, 0.0, 0.0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += switch_s
        entry[2] = max(entry[2], switch_s)
        entry[3] = switch_s
        entry[4] += dispatch_s

    def statistics(self) -> tuple[SwitchStatistics, ...]:
        return tuple(
            SwitchStatistics(model, source, target, int(v[0]), v[1], v[2], v[3], v[4])
            for (model, source, target), v in sorted(self._data.items())
        )


def worker_memory(instances: Iterable[Instance]) -> tuple[WorkerMemory, ...]:
    """Per worker process among ``instances``: its resident memory (psutil) and its ONNX
    Runtime arenas.

    ONNX Runtime does not say how large its CPU arena is; the process's resident
    set is the real figure that includes it. Without the CUDA provider the GPU
    arena is "absent".
    """
    found = []
    for instance in instances:
        if not isinstance(instance, ProcessInstance):
            continue
        spec = instance.spec
        memory = spec.run.memory or FrameworkMemoryConfig()
        pid = instance.pid
        rss: int | None = None
        if pid is not None:
            with contextlib.suppress(psutil.Error):
                rss = int(psutil.Process(pid).memory_info().rss)
        found.append(
            WorkerMemory(
                model=spec.model,
                version=spec.version,
                instance=spec.index,
                pid=pid,
                rss_bytes=rss,
                cpu_arena=memory.describe_cpu(),
                gpu=memory.describe_gpu(spec.providers),
                gpu_bytes=_gpu_bytes(pid)
                if pid is not None and "CUDAExecutionProvider" in spec.providers
                else None,
            )
        )
    return tuple(found)


def _gpu_bytes(pid: int) -> int | None:
    """GPU memory process ``pid`` holds over all devices (NVML); None if unreadable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        total = None
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid == pid and process.usedGpuMemory is not None:
                    total = (total or 0) + int(process.usedGpuMemory)
        return total
    except Exception:  # no library, no driver, no permission: no figure, never a guess
        return None
