"""The statistics records of the execution layer (what telemetry exports)."""

from __future__ import annotations

from sordino.records import SwitchStatistics

__all__ = ["SwitchRecorder"]


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
