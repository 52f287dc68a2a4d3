"""Devices: where model instances run, and which ones this machine actually has.

Without a ``fallback_chain`` a model runs on one tier of devices chosen by its
instance group (``cpu``, ``gpu`` with its ``gpus`` ids, or ``auto`` which follows the
model's ``execution_providers``). ``execution_providers`` is a list of preferences: the
providers this onnxruntime build lacks are dropped with one log line, and only a list
of which none is available stops the model from loading. With a chain, every model runs
``instance_count`` instances on every available device of the chain, in chain order, so
a switch finds a warm instance waiting.

A chain may name devices not declared under ``devices`` (the brief's ``accelerator_v3``,
``accelerator_v2``, ``cpu_fallback``). Such a name resolves by a fixed rule: a name that
starts with ``cpu`` is the CPU; any other name is an accelerator, and those names take
the accelerators present (CUDA devices ONNX Runtime can use, not already declared by the
chain's own devices) in chain order. A name left without an accelerator is unavailable:
one warning line and a ``device_unavailable`` event, and the chain skips it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from sordino.backends.gpus import nvml_count, visible_count
from sordino.config.devices import EXECUTION_PROVIDERS
from sordino.errors import ModelLoadError

if TYPE_CHECKING:
    from sordino.config import ModelConfig, RuntimeConfig

__all__ = [
    "Device",
    "Tier",
    "accelerators_present",
    "available_providers",
    "chain_devices",
    "default_intra_op_threads",
    "missing_provider",
    "model_tiers",
    "preferred_providers",
]

log = logging.getLogger("sordino.devices")

_ACCELERATED = ("CUDAExecutionProvider", "TensorrtExecutionProvider")


@dataclass(frozen=True, slots=True)
class Device:
    """One place to run instances: an ONNX Runtime provider list and a device index."""

    name: str
    providers: tuple[str, ...]
    device_id: int | None = None
    intra_op_threads: int | None = None
    absent: str | None = None
    """Why this machine has no such device (an undeclared chain name left without an
    accelerator); None when it may exist."""

    @property
    def target(self) -> str:
        """What the backend's ``load`` gets: ``cpu`` or ``cuda:N``."""
        if self.device_id is not None and self.providers[0] in _ACCELERATED:
            return f"cuda:{self.device_id}"
        return "cpu"

    @property
    def kind(self) -> str:
        return "gpu" if self.providers[0] in _ACCELERATED else "cpu"


@dataclass(frozen=True, slots=True)
class Tier:
    """One link of a model's chain: a name (its breaker's) and the devices it spans."""

    name: str
    devices: tuple[Device, ...]


def available_providers() -> list[str]:
    """The execution providers of this onnxruntime build."""
    import onnxruntime as ort

    return list(ort.get_available_providers())


def default_intra_op_threads(instances: int) -> int:
    """ONNX Runtime's intra-op threads when none are configured: the cores this process
    may run on, shared among the model's ``instances`` (at least one each).

    ONNX Runtime's own default is every physical core per session, so several instances
    (and the server) fight for the same cores.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, instances))


def chain_devices(config: RuntimeConfig) -> list[Device] | None:
    """The devices of the configured fallback chain, in order; None without a chain.

    Declared devices are taken as declared; undeclared names resolve by the rule in the
    module docstring (``cpu*``: the CPU; others: the next accelerator present).
    """
    chain = config.scheduler.fallback_chain
    if chain is None:
        return None
    specs = {name: config.device(name) for name in chain.chain}
    taken = {
        spec.device_id
        for spec in specs.values()
        if spec is not None and spec.provider in _ACCELERATED
    }
    present = accelerators_present()
    free = [index for index in present if index not in taken]
    if EXECUTION_PROVIDERS["cuda"] not in available_providers():
        none_left = "CUDAExecutionProvider is not in this onnxruntime build"
    else:
        none_left = f"{len(present)} accelerator(s) present, each taken by an earlier name"
    devices = []
    for name, spec in specs.items():
        if spec is not None:
            devices.append(
                Device(
                    name=spec.name,
                    providers=(spec.provider,),
                    device_id=spec.device_id if spec.provider in _ACCELERATED else None,
                    intra_op_threads=spec.intra_op_threads,
                )
            )
        elif name.lower().startswith("cpu"):
            log.info("fallback_chain: %s is not declared under devices; it is the CPU", name)
            devices.append(Device(name, (EXECUTION_PROVIDERS["cpu"],)))
        elif free:
            index = free.pop(0)
            log.info(
                "fallback_chain: %s is not declared under devices; it is accelerator %d "
                "(CUDAExecutionProvider)",
                name,
                index,
            )
            devices.append(Device(name, (EXECUTION_PROVIDERS["cuda"],), index))
        else:
            devices.append(
                Device(
                    name,
                    (EXECUTION_PROVIDERS["cuda"],),
                    absent=(
                        "not declared under devices, and no accelerator is left for it "
                        f"({none_left}); declare it under devices to choose its provider"
                    ),
                )
            )
    return devices


def accelerators_present() -> tuple[int, ...]:
    """The indices of the CUDA devices ONNX Runtime can use here, in order.

    None without ``CUDAExecutionProvider`` in this onnxruntime build; else the devices
    ``CUDA_VISIBLE_DEVICES`` leaves visible (CUDA stops at the first ``-1``), or NVML's
    count. When neither can count, one is assumed: an instance that then fails to open
    marks the device unavailable as any absent device is.
    """
    if EXECUTION_PROVIDERS["cuda"] not in available_providers():
        return ()
    listed = visible_count()
    if listed is not None:
        return tuple(range(listed))
    counted = nvml_count()
    if counted is None:  # no library or no driver: the provider is here, so try one device
        return (0,)
    return tuple(range(counted))


def model_tiers(model: ModelConfig, chain: list[Device] | None) -> list[Tier]:
    """The tiers ``model`` runs on, best first (one tier without a fallback chain)."""
    if chain is not None:
        return [
            Tier(
                device.name,
                (
                    replace(
                        device,
                        intra_op_threads=device.intra_op_threads
                        or model.intra_op_threads
                        or default_intra_op_threads(model.instance_count),
                    ),
                ),
            )
            for device in chain
        ]
    threads = model.intra_op_threads or default_intra_op_threads(model.instance_count)
    if model.instance_kind == "gpu":
        providers: tuple[str, ...] = (EXECUTION_PROVIDERS["cuda"],)
    elif model.instance_kind == "cpu" or not _onnx_runtime_devices(model):
        # A backend that is not ONNX Runtime has no provider list to follow: ``auto``
        # is the CPU (as Triton's Python backend), ``gpu`` names CUDA devices.
        providers = (EXECUTION_PROVIDERS["cpu"],)
    else:
        providers = preferred_providers(model)
    if providers[0] in _ACCELERATED:
        ids = model.gpus or (0,)
        devices = tuple(Device(f"gpu{i}", providers, i, threads) for i in ids)
        return [Tier("gpu", devices)]
    return [Tier("cpu", (Device("cpu", providers, None, threads),))]


def _onnx_runtime_devices(model: ModelConfig) -> bool:
    """Whether ``model``'s backend kind runs on ONNX Runtime provider lists."""
    from sordino.backends.registry import backend_kinds

    kind = backend_kinds().get(model.backend)
    return kind is None or kind.execution_providers


def preferred_providers(model: ModelConfig) -> tuple[str, ...]:
    """The model's ``execution_providers`` this machine has, in its order of preference.

    A missing preferred provider is dropped with one log line, as a chain skips an
    absent device; a list of which none is available is a :class:`ModelLoadError` that
    names what is.
    """
    wanted = tuple(model.execution_providers)
    available = available_providers()
    usable = tuple(p for p in wanted if p in available)
    absent = [p for p in wanted if p not in available]
    if not usable:
        raise ModelLoadError(
            f"model {model.name}: none of its execution_providers ({', '.join(wanted)}) is in "
            f"this onnxruntime build (available: {', '.join(available)}); add one of those "
            "to execution_providers or install the matching onnxruntime package"
        )
    if absent:
        log.warning(
            "model %s: %s not in this onnxruntime build; falling back to %s",
            model.name,
            ", ".join(absent) + (" is" if len(absent) == 1 else " are"),
            ", ".join(usable),
        )
    return usable


def missing_provider(device: Device) -> str | None:
    """Why ``device`` cannot run on this machine, or None when it may."""
    if device.absent is not None:
        return device.absent
    available = available_providers()
    absent = [p for p in device.providers if p not in available]
    if not absent:
        return None
    return (
        f"{', '.join(absent)} is not in this onnxruntime build (available: {', '.join(available)})"
    )
