"""Resource figures: process memory, memory pools, CPU and GPU temperature, GPU memory.

Every figure is read from the machine at sampling time. A figure the machine cannot
give (no sensors, no NVIDIA driver, no memory pool) is ``None`` or absent, never a
made-up zero.

Memory pools are registered by whoever owns them (``add_pool``) as a callable
returning the pool's ``statistics()`` record; the adapter reads the usual field
names (``reserved_bytes``/``in_use_bytes``/``fragmentation`` and close variants), so
this module does not import the memory layer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

__all__ = ["GpuSample", "PoolSample", "ResourceSample", "ResourceSampler", "pool_sample"]

log = logging.getLogger("sordino.telemetry")

# psutil sensor groups that describe the CPU package, most specific first.
_CPU_SENSORS = ("coretemp", "k10temp", "zenpower", "cpu_thermal", "cpu-thermal", "soc_thermal")


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One NVIDIA GPU as NVML reports it; fields NVML refuses are None."""

    index: int
    name: str
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    temperature_c: float | None
    power_w: float | None
    utilization: float | None


@dataclass(frozen=True, slots=True)
class PoolSample:
    """One memory pool: bytes reserved from the system, bytes handed out, fragmentation."""

    name: str
    reserved_bytes: int | None
    in_use_bytes: int | None
    fragmentation: float | None


@dataclass(frozen=True, slots=True)
class ResourceSample:
    """The machine-level figures at one moment."""

    rss_bytes: int
    cpu_percent: float
    cpu_temp_c: float | None
    pools: tuple[PoolSample, ...]
    gpus: tuple[GpuSample, ...]
    injected_temp_c: float | None = None
    """A reading injected by a chaos ``temperature`` fault; it wins over the sensors."""

    @property
    def pool_reserved_bytes(self) -> int | None:
        values = [p.reserved_bytes for p in self.pools if p.reserved_bytes is not None]
        return sum(values) if values else None

    @property
    def pool_in_use_bytes(self) -> int | None:
        values = [p.in_use_bytes for p in self.pools if p.in_use_bytes is not None]
        return sum(values) if values else None

    @property
    def fragmentation(self) -> float | None:
        """The worst pool's fragmentation (the one compaction would act on first)."""
        values = [p.fragmentation for p in self.pools if p.fragmentation is not None]
        return max(values) if values else None

    @property
    def device_temp_c(self) -> float | None:
        """The hottest device: a GPU when present, else the CPU; an injected reading wins."""
        if self.injected_temp_c is not None:
            return self.injected_temp_c
        values = [g.temperature_c for g in self.gpus if g.temperature_c is not None]
        return max(values) if values else self.cpu_temp_c


def _first(stats: Any, *names: str) -> Any:
    for name in names:
        value = getattr(stats, name, None)
        if value is not None:
            return value
    return None


def pool_sample(name: str, stats: Any) -> PoolSample:
    """Read a pool's ``statistics()`` record by the usual field names."""
    reserved = _first(stats, "reserved_bytes", "total_bytes", "capacity_bytes", "reserved")
    in_use = _first(stats, "in_use_bytes", "used_bytes", "allocated_bytes", "in_use")
    fragmentation = _first(stats, "fragmentation", "fragmentation_ratio")
    return PoolSample(
        name,
        int(reserved) if reserved is not None else None,
        int(in_use) if in_use is not None else None,
        float(fragmentation) if fragmentation is not None else None,
    )


def cpu_temperature() -> float | None:
    """The CPU package temperature in °C, or None where the machine has no such sensor."""
    reader = getattr(psutil, "sensors_temperatures", None)
    if reader is None:
        return None
    try:
        groups = reader()
    except (OSError, RuntimeError):
        return None
    for name in _CPU_SENSORS:
        entries = [e.current for e in groups.get(name, ()) if e.current and e.current > 0]
        if entries:
            return float(max(entries))
    return None


class _Nvml:
    """NVML, initialised once; ``available`` is False without an NVIDIA driver."""

    def __init__(self) -> None:
        self.available = False
        self._nvml: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no library, no driver, no device: no GPU figures
            return
        self._nvml = pynvml
        self.available = pynvml.nvmlDeviceGetCount() > 0

    def sample(self) -> tuple[GpuSample, ...]:
        if not self.available:
            return ()
        return tuple(self._device(i) for i in range(self._nvml.nvmlDeviceGetCount()))

    def _device(self, index: int) -> GpuSample:
        nvml = self._nvml
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = _try(lambda: nvml.nvmlDeviceGetMemoryInfo(handle))
        power_mw = _try(lambda: nvml.nvmlDeviceGetPowerUsage(handle))
        rates = _try(lambda: nvml.nvmlDeviceGetUtilizationRates(handle))
        temperature = _try(lambda: nvml.nvmlDeviceGetTemperature(handle, 0))  # 0: the GPU die
        return GpuSample(
            index=index,
            name=str(_try(lambda: nvml.nvmlDeviceGetName(handle)) or f"gpu{index}"),
            memory_used_bytes=int(memory.used) if memory is not None else None,
            memory_total_bytes=int(memory.total) if memory is not None else None,
            temperature_c=float(temperature) if temperature is not None else None,
            power_w=power_mw / 1000.0 if power_mw is not None else None,
            utilization=rates.gpu / 100.0 if rates is not None else None,
        )


def _try(read: Callable[[], Any]) -> Any:
    try:
        return read()
    except Exception:  # NVML raises NVMLError_NotSupported per field on some boards
        return None


class ResourceSampler:
    """Samples process, pool, CPU and GPU figures on demand."""

    def __init__(self, *, gpus: bool = True) -> None:
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # prime: the first call always returns 0.0
        self._pools: dict[str, Callable[[], Any]] = {}
        self._nvml = _Nvml() if gpus else None
        self._last: ResourceSample | None = None
        self._unreadable = False
        self.temperature_override: Callable[[], float | None] | None = None
        """Set by the runtime to the chaos registry's injected temperature."""

    def add_pool(self, name: str, statistics: Callable[[], Any]) -> None:
        """Report the pool whose ``statistics()`` is ``statistics`` under ``name``.

        ``statistics`` may return None while the pool does not exist yet; it is then
        left out of the sample.
        """
        self._pools[name] = statistics

    def remove_pool(self, name: str) -> None:
        self._pools.pop(name, None)

    @property
    def has_gpu(self) -> bool:
        return self._nvml is not None and self._nvml.available

    def sample(self) -> ResourceSample:
        """Read every figure now."""
        pools = []
        for name, source in list(self._pools.items()):
            try:
                stats = source()
                if stats is not None:
                    pools.append(pool_sample(name, stats))
            except Exception:
                log.exception("memory pool %s statistics failed", name)
        try:
            rss = int(self._process.memory_info().rss)
            cpu = float(self._process.cpu_percent(None))
        except (OSError, psutil.Error) as exc:
            # /proc cannot be read, e.g. every descriptor is taken (EMFILE): the last
            # figures stand in, so the second is still closed and journaled.
            last = self._last
            if last is None:
                raise
            if not self._unreadable:
                log.warning("process figures unreadable (%s); repeating the last ones", exc)
            self._unreadable = True
            rss, cpu = last.rss_bytes, last.cpu_percent
        else:
            self._unreadable = False
        self._last = ResourceSample(
            rss_bytes=rss,
            cpu_percent=cpu,
            cpu_temp_c=cpu_temperature(),
            pools=tuple(pools),
            gpus=self._nvml.sample() if self._nvml is not None else (),
            injected_temp_c=self.temperature_override() if self.temperature_override else None,
        )
        return self._last

    def last(self) -> ResourceSample:
        """The latest sample (taking one if none was taken yet)."""
        return self._last if self._last is not None else self.sample()
