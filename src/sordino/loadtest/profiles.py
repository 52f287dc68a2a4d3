"""Traffic profiles: piecewise segments of arrival rate, and the traffic mix they carry.

A profile is a small YAML file. The built-in ones (``steady``, ``ramp``, ``spike``,
``diurnal``, ``black_friday``) ship in ``sordino/loadtest/profiles/``; copy one to
start your own. A built-in name followed by ``_`` and a year names the same profile
(``black_friday_2024`` is ``black_friday``): the year tells runs apart, and
``sordino stress-test`` names its event after the whole name. Rates are requests per
second as written; :meth:`Profile.scaled` stretches the profile to a chosen total
duration (``--duration``) and a chosen peak rate (``--peak-rate``), keeping its shape.

A segment's ``shape`` says how the rate moves during it:

- ``flat``: ``rate`` throughout;
- ``ramp``: linearly from ``rate`` to ``to``;
- ``wave``: half a sine from ``rate`` up to ``to`` and back (a day's swell);
- ``bursts``: ``rate``, multiplied by ``burst_factor`` for ``burst_length`` at the
  start of every ``burst_every``.
"""

from __future__ import annotations

import math
import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, ValidationError, model_validator

from sordino.config.base import Section
from sordino.config.bounded import load_yaml
from sordino.config.units import Duration
from sordino.errors import ConfigError

__all__ = [
    "BUILTIN_PROFILES",
    "Profile",
    "Segment",
    "TrafficClass",
    "builtin_name",
    "load_profile",
    "profile_text",
]

BUILTIN_PROFILES = ("steady", "ramp", "spike", "diurnal", "black_friday")
_DATED = re.compile(r"(?P<name>[a-z_]+)_(?P<year>(19|20|21)\d\d)")


class Segment(Section):
    """A stretch of the profile with one shape."""

    duration: Duration = Field(gt=0)
    """How long the segment lasts (``30s``, ``10m``)."""
    rate: float = Field(ge=0)
    """Requests per second at the segment's start (and throughout for ``flat``)."""
    to: float | None = Field(default=None, ge=0)
    """The rate at the end (``ramp``) or at the crest (``wave``)."""
    shape: Literal["flat", "ramp", "wave", "bursts"] = "flat"
    burst_factor: float = Field(default=2.0, gt=0)
    """``bursts``: the rate is multiplied by this during a burst."""
    burst_every: Duration = Field(default=60.0, gt=0)
    burst_length: Duration = Field(default=5.0, gt=0)

    @model_validator(mode="after")
    def _check_shape(self) -> Segment:
        if self.shape in ("ramp", "wave") and self.to is None:
            raise ValueError(f"a {self.shape!r} segment needs 'to' (the rate it reaches)")
        if self.shape not in ("ramp", "wave") and self.to is not None:
            raise ValueError(f"'to' is only for ramp and wave segments, not {self.shape!r}")
        if self.shape == "bursts" and self.burst_length >= self.burst_every:
            raise ValueError("burst_length must be shorter than burst_every")
        return self

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        """The rate at offsets ``t`` (seconds from the segment's start)."""
        d = self.duration
        if self.shape == "flat":
            return np.full_like(t, self.rate)
        end = self.to if self.to is not None else self.rate
        if self.shape == "ramp":
            return self.rate + (end - self.rate) * t / d
        if self.shape == "wave":
            return self.rate + (end - self.rate) * np.sin(math.pi * t / d)
        bursting = np.mod(t, self.burst_every) < self.burst_length
        return np.where(bursting, self.rate * self.burst_factor, self.rate)

    def peak(self) -> float:
        if self.shape == "bursts":
            return self.rate * self.burst_factor
        return max(self.rate, self.to or 0.0)


class TrafficClass(Section):
    """One kind of request in the mix, sent with probability ``weight / total``."""

    weight: float = Field(default=1.0, gt=0)
    model: str | None = None
    """The model to call; None means the model given on the command line."""
    tenant: str | None = None
    """Sent as ``X-Sordino-Tenant``."""
    tag: str | None = None
    """Sent as ``X-Sordino-Tag``: the server maps tags to priorities (stream_priority)."""
    batch: int = Field(default=1, ge=1, le=4096)
    """Rows per request: the size of the batch dimension."""
    stream: bool = False
    """Streaming requests: ``POST …/generate_stream`` (Server-Sent Events), one response
    per step of a streaming or iterative model; the latency is to the last event, and
    the time to the first one is reported as the group ``first response``."""
    inputs: dict[str, Any] | None = None
    """For a streaming class: the generate body's input values (``{"prompt": "a 7",
    "steps": 20}``); without it, random values of each input's datatype and shape."""

    @model_validator(mode="after")
    def _inputs_need_stream(self) -> TrafficClass:
        if self.inputs is not None and not self.stream:
            raise ValueError(
                "'inputs' is the body of a streaming request: set stream: true, or give "
                "unary payloads with --data"
            )
        return self

    @property
    def label(self) -> str:
        """The class's name in reports: its tag, else its tenant, else 'default'."""
        return self.tag or self.tenant or "default"


class Profile(Section):
    """A traffic profile: how the arrival rate moves, and what the requests are."""

    name: str = "custom"
    description: str = ""
    arrivals: Literal["poisson", "constant"] = "poisson"
    """Poisson arrivals (exponential gaps, as independent users make) or evenly spaced."""
    segments: tuple[Segment, ...] = Field(min_length=1)
    mix: tuple[TrafficClass, ...] = (TrafficClass(),)

    @model_validator(mode="after")
    def _check(self) -> Profile:
        if self.peak() <= 0:
            raise ValueError("every segment has rate 0: the profile would send nothing")
        return self

    @property
    def duration(self) -> float:
        return float(sum(s.duration for s in self.segments))

    def peak(self) -> float:
        return max(s.peak() for s in self.segments)

    def scaled(self, *, duration: float | None = None, peak_rate: float | None = None) -> Profile:
        """This profile stretched to ``duration`` seconds and ``peak_rate`` requests/s."""
        time_k = duration / self.duration if duration else 1.0
        rate_k = peak_rate / self.peak() if peak_rate else 1.0
        segments = tuple(
            s.model_copy(
                update={
                    "duration": s.duration * time_k,
                    "rate": s.rate * rate_k,
                    "to": None if s.to is None else s.to * rate_k,
                    "burst_every": s.burst_every * time_k,
                    "burst_length": s.burst_length * time_k,
                }
            )
            for s in self.segments
        )
        return self.model_copy(update={"segments": segments})

    def rate_at(self, t: np.ndarray) -> np.ndarray:
        """The intended rate (requests/s) at offsets ``t`` from the start."""
        out = np.zeros_like(t, dtype=float)
        start = 0.0
        for segment in self.segments:
            inside = (t >= start) & (t < start + segment.duration)
            out[inside] = segment.rate_at(t[inside] - start)
            start += segment.duration
        return out


def profile_text(name: str) -> str:
    """The YAML of a built-in profile."""
    return (resources.files("sordino.loadtest") / "profiles" / f"{name}.yaml").read_text("utf-8")


def builtin_name(spec: str) -> str | None:
    """The built-in profile ``spec`` names: itself, or ``NAME_YEAR`` (``black_friday_2024``)."""
    if spec in BUILTIN_PROFILES:
        return spec
    dated = _DATED.fullmatch(spec)
    if dated is not None and dated["name"] in BUILTIN_PROFILES:
        return dated["name"]
    return None


def load_profile(spec: str) -> Profile:
    """A built-in profile by name (or ``NAME_YEAR``), or a profile file by path.

    Raises :class:`ConfigError` naming the file, the key, the value and what is
    allowed when the profile is not valid.
    """
    builtin = builtin_name(spec)
    if builtin is not None:
        text, source = profile_text(builtin), f"built-in profile {builtin!r}"
    else:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"--profile {spec!r} is neither a built-in profile "
                f"({', '.join(BUILTIN_PROFILES)}, or one of them with a year: "
                "black_friday_2024) nor a file"
            )
        text, source = path.read_text("utf-8"), f"profile {path}"
    data = load_yaml(text, source)[0]
    if not isinstance(data, dict):
        raise ConfigError(f"{source} must be a mapping with 'segments' (and optionally 'mix')")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        lines = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "(top level)"
            value = "" if error["type"] == "missing" else f" (got {error['input']!r})"
            lines.append(f"  {where}: {error['msg']}{value}")
        raise ConfigError(f"{source} is not a valid profile:\n" + "\n".join(lines)) from None
