"""``server.trace``: Triton's request tracing, set at start (``--trace-config``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from sordino.config.base import ExpandedPath, Section

__all__ = ["TraceConfig"]

Level = Literal["OFF", "TIMESTAMPS"]


class TraceConfig(Section):
    """Which requests are traced and where their timestamps go (Triton's ``triton``
    trace mode; ``server/tracing.py``). The level, rate, count and log frequency may
    be changed while the server runs (``/v2/trace/setting``); the file may not."""

    file: ExpandedPath | None = None
    """Where the traces are written (``PATH``, or ``PATH.0``, ``PATH.1``, … with a
    ``log_frequency``); None: no tracing (Triton's ``--trace-config triton,file=``)."""
    level: tuple[Level, ...] = ("OFF",)
    """``["TIMESTAMPS"]`` traces; ``["OFF"]`` does not (``level=``)."""
    rate: int = Field(default=1000, ge=1)
    """Trace every N-th request of a model (``rate=``)."""
    count: int = Field(default=-1, ge=-1)
    """Traces to take, then stop; -1: no limit (``count=``; 0 is refused, as on Triton)."""
    log_frequency: int = Field(default=0, ge=0)
    """Write every N traces to a file of their own; 0: all in one when the server stops
    (``triton,log-frequency=``)."""
    mode: Literal["triton"] = "triton"
    """Triton's own trace format (``mode=``; ``opentelemetry`` is not supported)."""

    @model_validator(mode="after")
    def _file_for_timestamps(self) -> TraceConfig:
        if self.count == 0:
            raise ValueError("count must be -1 (no limit) or the number of traces to take")
        if "TIMESTAMPS" in self.level and self.file is None:
            raise ValueError(
                "level TIMESTAMPS needs a trace file: give file (--trace-config triton,file=PATH)"
            )
        return self
