"""The brief's observability layers in a journal window, as sentences for the reports.

``sordino diagnose`` and ``sordino postmortem`` both show, beside their own sections:

- **execution layer** — each instance's busy share (mean and peak over the
  ``utilisation`` events, journaled every 10 s by the telemetry hub); on a GPU an
  instance's busy share is its compute stream's utilisation (one stream per instance);
- **resource layer** — bandwidth moved through the arena and the worker hop against the
  machine's measured copy bandwidth (saturation), from the same events;
- **business layer** — user satisfaction: the ``feedback`` events' ratings correlated
  with the rated requests' latency, degradation and errors
  (:func:`sordino.telemetry.satisfaction.correlate`);
- **prediction layer** — the next-hour forecast, or how many more minutes of history it
  needs (:func:`forecast_lines`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from sordino.telemetry.feedback import FEEDBACK_KIND
from sordino.telemetry.forecast import ForecastSeries, short_message
from sordino.telemetry.journal_reader import JournalWindow
from sordino.telemetry.satisfaction import Satisfaction, correlate, satisfaction_lines

__all__ = ["Layers", "forecast_lines", "layer_sections", "layers_of"]

_UTILISATION = "utilisation"


@dataclass(frozen=True, slots=True)
class Layers:
    """What a window's ``utilisation`` and ``feedback`` events say."""

    moved_mean: float | None
    """Bytes per second moved (every path), mean over the journaled 10 s periods."""
    moved_peak: float | None
    by_path: dict[str, float]
    capacity: float | None
    saturation_mean: float | None
    saturation_peak: float | None
    instances: dict[str, tuple[float, float, str]] = field(default_factory=dict)
    """``model/version/index`` → (mean busy share, peak, device)."""
    satisfaction: Satisfaction = field(default_factory=lambda: correlate(()))


def layers_of(window: JournalWindow) -> Layers:
    """Read the window's ``utilisation`` and ``feedback`` events."""
    moved: list[float] = []
    paths: dict[str, list[float]] = {}
    saturations: list[float] = []
    capacity = None
    busy: dict[str, list[float]] = {}
    devices: dict[str, str] = {}
    ratings = []
    for event in window.events:
        if event.kind == FEEDBACK_KIND:
            ratings.append(event.payload)
            continue
        if event.kind != _UTILISATION:
            continue
        band = event.payload.get("bandwidth") or {}
        if isinstance(band.get("moved_bytes_s"), int | float):
            moved.append(float(band["moved_bytes_s"]))
        for path, value in (band.get("bytes_s") or {}).items():
            paths.setdefault(path, []).append(float(value))
        if isinstance(band.get("saturation"), int | float):
            saturations.append(float(band["saturation"]))
        if isinstance(band.get("capacity_bytes_s"), int | float):
            capacity = float(band["capacity_bytes_s"])
        for key, instance in (event.payload.get("instances") or {}).items():
            busy.setdefault(key, []).append(float(instance.get("busy", 0.0)))
            devices[key] = str(instance.get("device", ""))
    return Layers(
        moved_mean=float(np.mean(moved)) if moved else None,
        moved_peak=max(moved) if moved else None,
        by_path={p: float(np.mean(v)) for p, v in paths.items()},
        capacity=capacity,
        saturation_mean=float(np.mean(saturations)) if saturations else None,
        saturation_peak=max(saturations) if saturations else None,
        instances={k: (float(np.mean(v)), max(v), devices[k]) for k, v in sorted(busy.items())},
        satisfaction=correlate(ratings),
    )


def _rate(value: float | None) -> str:
    if value is None:
        return "n/a"
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value:.0f} B/s"


def _share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def forecast_lines(
    forecasts: dict[str, ForecastSeries],
    memory: ForecastSeries | None,
    short: dict[str, int],
    memory_short: int,
) -> list[str]:
    """The prediction layer: each forecast, or what its history still lacks."""
    lines = [
        f"{name}: {s.mean:.1f} requests/s on average next hour, peak {s.peak:.1f} "
        f"({s.method}, {s.history_points} points of {s.step_s} s)"
        for name, s in forecasts.items()
    ]
    lines += [f"{name}: {short_message(minutes)}" for name, minutes in short.items()]
    if memory is not None:
        lines.append(
            f"memory: {memory.mean / 2**20:.0f} MB on average next hour, peak "
            f"{memory.peak / 2**20:.0f} MB ({memory.method})"
        )
    elif memory_short:
        lines.append(f"memory: {short_message(memory_short)}")
    return lines


def layer_sections(layers: Layers) -> list[tuple[str, list[str]]]:
    """The execution, resource and business layers as (title, lines)."""
    execution = [
        f"{key} on {device or 'n/a'}: busy {_share(mean)} on average, peak {_share(peak)}"
        for key, (mean, peak, device) in layers.instances.items()
    ] or ["no instance utilisation journaled in this period"]
    execution.append(
        "Each instance runs its own session: on a GPU its busy share is its CUDA stream's "
        "utilisation (one stream per instance); on this CPU there are no streams."
    )
    if layers.moved_mean is None:
        resource = ["no bandwidth figures journaled in this period"]
    else:
        paths = ", ".join(f"{p.replace('_', ' ')} {_rate(v)}" for p, v in layers.by_path.items())
        resource = [
            f"moved {_rate(layers.moved_mean)} on average ({paths}), "
            f"peak {_rate(layers.moved_peak)}",
            f"saturation {_share(layers.saturation_mean)} on average, peak "
            f"{_share(layers.saturation_peak)} of the measured copy bandwidth "
            f"{_rate(layers.capacity)}",
            "host↔device copies: not measured (ONNX Runtime makes them inside run() and "
            "reports no count)",
        ]
    return [
        ("Execution layer: instance (stream) utilisation", execution),
        ("Resource layer: bandwidth saturation", resource),
        ("Business layer: user satisfaction", satisfaction_lines(layers.satisfaction)),
    ]
