"""The NVIDIA GPUs this machine shows, counted without CUDA or a framework.

A backend that is not ONNX Runtime (a Python model) is given a GPU by its instance
group's ``KIND_GPU`` and uses it with its own framework; sordino cannot ask ONNX
Runtime whether it exists. :func:`gpus_present` asks the driver: NVML where
``pynvml`` is installed, else the driver's ``/proc/driver/nvidia/gpus`` entries, else
the ``/dev/nvidiaN`` device files; ``CUDA_VISIBLE_DEVICES`` then narrows them as CUDA
does (up to its first ``-1`` or blank entry).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from sordino.errors import ModelLoadError

__all__ = ["check_gpu", "gpus_present", "nvml_count", "visible_count"]

_DEVICE_FILE = re.compile(r"nvidia\d+")


def gpus_present() -> tuple[int, ...]:
    """The CUDA device indices a process here may use, in order; () without a GPU."""
    count = _driver_count()
    listed = visible_count()
    if listed is not None:
        count = min(count, listed)
    return tuple(range(count))


def visible_count() -> int | None:
    """How many devices ``CUDA_VISIBLE_DEVICES`` lists (CUDA stops at the first ``-1``
    or blank entry); None when it is not set."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return None
    listed = 0
    for entry in visible.split(","):
        if not entry.strip() or entry.strip() == "-1":
            break
        listed += 1
    return listed


def nvml_count() -> int | None:
    """NVML's count of the machine's GPUs; None without ``pynvml`` or a driver it loads."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no library, or no driver for it to load
        return None


def _driver_count() -> int:
    counted = nvml_count()
    if counted is not None:
        return counted
    gpus = Path("/proc/driver/nvidia/gpus")  # the driver's files, where NVML cannot count
    if gpus.is_dir():
        return sum(1 for _ in gpus.iterdir())
    dev = Path("/dev")
    try:
        return sum(1 for entry in dev.iterdir() if _DEVICE_FILE.fullmatch(entry.name))
    except OSError:
        return 0


def check_gpu(where: str, device: str) -> None:
    """Refuse an instance on ``device`` (``cuda:N``) when this machine shows no GPU N, as
    Triton refuses it ("specifies invalid or unsupported gpu id"): the model would be
    told it runs on a GPU that is not there."""
    wanted = int(device.split(":", 1)[1]) if ":" in device else 0
    present = gpus_present()
    if wanted not in present:
        shown = ", ".join(map(str, present)) if present else "none"
        raise ModelLoadError(
            f"{where}: its instance_group (KIND_GPU) puts an instance on GPU {wanted}, which "
            f"this machine does not have (GPUs: {shown}); give the group kind: KIND_CPU to "
            "run it on the CPU, or gpus: the GPUs there are"
        )
