"""What requests cost the arena: bytes per request learned per model and row bucket, how
long a request holds them, and the peak the QPS forecast implies (``pool_size: auto``).
"""

from __future__ import annotations

from collections.abc import Callable

from sordino.records import MemoryForecast
from sordino.telemetry.forecast import Forecast

__all__ = ["RequestCosts"]


class RequestCosts:
    """Learns each finished request's staged bytes and seconds; forecasts the peak."""

    def __init__(self, forecast: Callable[[], Forecast | None] = lambda: None) -> None:
        self._forecast = forecast
        # (model, rows bucket) -> [requests, bytes EWMA]; model -> seconds EWMA
        self._bytes: dict[tuple[str, int], list[float]] = {}
        self._seconds: dict[str, float] = {}

    def learn(self, model: str, rows: int, nbytes: int, seconds: float) -> None:
        """Note one finished request: its staged bytes and how long it held them."""
        bucket = 1 << max(0, rows - 1).bit_length()
        entry = self._bytes.get((model, bucket))
        if entry is None:
            if len(self._bytes) >= 1024:  # bounded: models are loaded, buckets are few
                return
            self._bytes[(model, bucket)] = [1, float(nbytes)]
        else:
            entry[0] += 1
            entry[1] += (nbytes - entry[1]) * 0.05
        previous = self._seconds.get(model)
        self._seconds[model] = (
            seconds if previous is None else previous + (seconds - previous) * 0.05
        )

    def forecasts(self) -> tuple[MemoryForecast, ...]:
        """Per model: bytes per request learned, and the peak the QPS forecast implies."""
        forecast = self._forecast()
        models: dict[str, list[tuple[int, int, int]]] = {}
        for (model, bucket), (count, nbytes) in sorted(self._bytes.items()):
            models.setdefault(model, []).append((bucket, int(count), int(nbytes)))
        found = []
        for model, buckets in models.items():
            total = sum(count for _, count, _ in buckets)
            per_request = sum(count * nbytes for _, count, nbytes in buckets) / total
            seconds = self._seconds.get(model, 0.0)
            series = forecast.qps.get(model) if forecast is not None else None
            peak = series.peak if series is not None else None
            found.append(
                MemoryForecast(
                    model=model,
                    buckets=tuple(buckets),
                    bytes_per_request=per_request,
                    seconds_per_request=seconds,
                    forecast_peak_qps=peak,
                    predicted_peak_bytes=peak * per_request * seconds if peak is not None else None,
                )
            )
        return tuple(found)

    def predicted_peak(self) -> float | None:
        """The arena bytes the forecasts imply at their peak, over every model; None
        when no model's peak is forecast."""
        peaks = [f.predicted_peak_bytes for f in self.forecasts()]
        known = [p for p in peaks if p is not None]
        return sum(known) if known else None
