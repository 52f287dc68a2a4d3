"""The ``scheduler`` section: the server-wide mode and its strategies.

A strategy is one entry of ``scheduler.strategies``, told apart by its ``name``:
``dynamic_batching`` (batching defaults), ``stream_priority`` (tag -> priority
rules) and ``fallback_chain`` (devices tried in order behind circuit breakers).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import BeforeValidator, Field, ValidationInfo, field_validator, model_validator

from sordino.config.base import MAX_BATCH_SIZE, Section, reject_repeated_names
from sordino.config.threshold import parse_threshold
from sordino.config.units import Duration, Milliseconds
from sordino.errors import ConfigError

__all__ = [
    "STRATEGY_NAMES",
    "DynamicBatchingStrategy",
    "FallbackChainStrategy",
    "PriorityRule",
    "SchedulerConfig",
    "SchedulerMode",
    "SchedulerPriority",
    "Strategy",
    "StreamPriorityStrategy",
    "check_priority",
]

SchedulerMode = Literal["auto", "manual", "hybrid", "adaptive", "conservative", "ultra_low_latency"]
"""Scheduling policies; ``sordino.scheduling.modes`` says what each one does."""

SchedulerPriority = Literal["queue", "frame_sync"]
"""How deadlines are kept: ``queue`` (Triton: a request that would miss its deadline is
refused at admission, one past it is dropped) or ``frame_sync`` (every request is one
frame: it gets a deadline of one frame at ``frame_rate`` unless it has its own, a late
one still runs, behind the ones on time, and its lateness is the ``frame_delay`` the
guardian watches, instead of being refused up front)."""

STRATEGY_NAMES = ("dynamic_batching", "stream_priority", "fallback_chain")


def check_priority(value: object) -> object:
    """A priority as written: 'high', 'normal', 'low' or an integer >= 1 (ValueError else)."""
    if isinstance(value, str) and value in ("high", "normal", "low"):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError("priority must be 'high', 'normal', 'low', or an integer >= 1 (1 is highest)")


class PriorityRule(Section):
    """Requests carrying ``tag`` are queued at ``priority``."""

    tag: str
    """The request tag this rule matches (exact match)."""
    priority: Annotated[int | Literal["high", "normal", "low"], BeforeValidator(check_priority)]
    """'high', 'normal', 'low', or a level >= 1 where 1 is the highest."""

    @field_validator("tag")
    @classmethod
    def _tag_not_blank(cls, tag: str) -> str:
        if not tag.strip():
            raise ValueError("tag must not be empty")
        return tag


class DynamicBatchingStrategy(Section):
    """Server-wide batching defaults; a model's ``dynamic_batching`` section overrides them."""

    name: Literal["dynamic_batching"]
    enabled: bool = True
    """False runs every request alone (batch size 1)."""
    min_batch: int = Field(default=1, ge=1, le=MAX_BATCH_SIZE)
    """Smallest batch worth running before ``timeout_ms`` has passed."""
    max_batch: int = Field(default=32, ge=1, le=MAX_BATCH_SIZE)
    """Largest batch formed; a model's ``max_batch_size`` caps it further."""
    timeout_ms: Milliseconds = Field(default=10.0, ge=0, le=60_000)
    """Longest the oldest queued request waits for a batch to fill."""
    preferred_batch: tuple[int, ...] = Field(default=(), max_length=64)
    """Batch sizes to form when possible; each between ``min_batch`` and ``max_batch``."""

    @field_validator("max_batch")
    @classmethod
    def _max_not_below_min(cls, max_batch: int, info: ValidationInfo) -> int:
        min_batch = info.data.get("min_batch")
        if min_batch is not None and min_batch > max_batch:
            raise ValueError(f"min_batch ({min_batch}) is larger than max_batch ({max_batch})")
        return max_batch

    @field_validator("preferred_batch")
    @classmethod
    def _preferred_in_range(cls, sizes: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        low, high = info.data.get("min_batch"), info.data.get("max_batch")
        if low is None or high is None:
            return sizes  # min_batch/max_batch already failed; that error is the useful one
        outside = [size for size in sizes if not low <= size <= high]
        if outside:
            raise ValueError(
                f"preferred batch sizes {outside} are outside min_batch..max_batch ({low}..{high})"
            )
        return sizes


class StreamPriorityStrategy(Section):
    """Maps request tags to queue priorities."""

    name: Literal["stream_priority"]
    rules: tuple[PriorityRule, ...]
    """Checked in order; each tag may appear once."""

    @field_validator("rules")
    @classmethod
    def _tags_unique(cls, rules: tuple[PriorityRule, ...]) -> tuple[PriorityRule, ...]:
        reject_repeated_names(
            (rule.tag for rule in rules),
            what="tags",
            verb="appear",
            hint="more than one rule per tag is ambiguous, give each tag one priority",
        )
        return rules


class FallbackChainStrategy(Section):
    """Device fallback chain: every model runs on ``primary``, then on each fallback in order.

    Each device has a circuit breaker that opens when ``switch_threshold`` holds over
    its window (with at least ``min_requests`` batches in it), sends traffic down the
    chain while open, and lets ``half_open_probes`` batches test the device after
    ``cooldown`` before closing again.
    """

    name: Literal["fallback_chain"]
    primary: str
    """Name of the device (from ``devices``) that serves while it is healthy."""
    fallbacks: tuple[str, ...] = Field(min_length=1)
    """Devices to use, in order, while the ones before them are failing or missing."""
    switch_threshold: str = "error_rate>5% for 30s"
    """When a device's breaker opens: '<metric> <op> <value> for <window>'."""
    min_requests: int = Field(default=10, ge=1, le=1_000_000)
    """Batches a window must hold before the threshold may open the breaker."""
    cooldown: Duration = Field(default=5.0, ge=0, le=86_400)
    """How long an open breaker waits before half-open probes test the device again."""
    half_open_probes: int = Field(default=3, ge=1, le=1000)
    """Consecutive successful probe batches that close the breaker again."""

    @field_validator("switch_threshold")
    @classmethod
    def _parsable(cls, text: str) -> str:
        try:
            parse_threshold(text)
        except ConfigError as exc:  # pydantic reports only ValueError as a validation error
            raise ValueError(str(exc)) from None
        return text

    @model_validator(mode="after")
    def _distinct(self) -> FallbackChainStrategy:
        reject_repeated_names(
            self.chain, what="devices", verb="appear", hint="a chain tries each device once"
        )
        return self

    @property
    def chain(self) -> tuple[str, ...]:
        """Device names in order: the primary, then the fallbacks."""
        return (self.primary, *self.fallbacks)


Strategy = Annotated[
    DynamicBatchingStrategy | StreamPriorityStrategy | FallbackChainStrategy,
    Field(discriminator="name"),
]


class SchedulerConfig(Section):
    """How queued requests become batches, server-wide."""

    mode: SchedulerMode = "adaptive"
    """Scheduling policy; a model's ``scheduler_mode`` overrides it."""
    slo_p99_ms: float = Field(default=100.0, gt=0, le=3_600_000)
    """Target 99th-percentile latency in milliseconds that adaptive modes steer towards."""
    strategies: tuple[Strategy, ...] = ()
    """Strategy sections, each ``name`` at most once."""
    priority: SchedulerPriority = "queue"
    """``frame_sync``: requests keep pace with a frame clock (see :data:`SchedulerPriority`)."""
    frame_rate: float = Field(default=60.0, gt=0, le=1000)
    """``frame_sync``: frames a second; one frame (1/frame_rate) is a request's default deadline."""

    triton_aliases: ClassVar[tuple[str, ...]] = ("max_batch",)
    """Other spellings accepted (the loader lists them among the valid keys)."""

    @model_validator(mode="before")
    @classmethod
    def _max_batch_alias(cls, data: object) -> object:
        """``max_batch`` at the top (the brief's spelling) is ``dynamic_batching.max_batch``."""
        if not isinstance(data, dict) or "max_batch" not in data:
            return data
        data = dict(data)
        max_batch = data.pop("max_batch")
        strategies = list(data.get("strategies") or ())
        for index, strategy in enumerate(strategies):
            if isinstance(strategy, dict) and strategy.get("name") == "dynamic_batching":
                if "max_batch" in strategy and strategy["max_batch"] != max_batch:
                    raise ValueError(
                        f"scheduler.max_batch ({max_batch}) and the dynamic_batching "
                        f"strategy's max_batch ({strategy['max_batch']}) disagree; "
                        "scheduler.max_batch is the same setting, keep one of them"
                    )
                strategies[index] = {**strategy, "max_batch": max_batch}
                break
        else:
            strategies.append({"name": "dynamic_batching", "max_batch": max_batch})
        data["strategies"] = strategies
        return data

    @property
    def frame_s(self) -> float:
        """One frame in seconds (``frame_sync``'s default deadline)."""
        return 1.0 / self.frame_rate

    @field_validator("strategies")
    @classmethod
    def _names_unique(cls, strategies: tuple[Strategy, ...]) -> tuple[Strategy, ...]:
        reject_repeated_names(
            (strategy.name for strategy in strategies),
            what="strategies",
            verb="are configured",
            hint="keep one each",
        )
        return strategies

    @property
    def dynamic_batching(self) -> DynamicBatchingStrategy:
        """The configured ``dynamic_batching`` strategy, or its defaults when absent."""
        for strategy in self.strategies:
            if isinstance(strategy, DynamicBatchingStrategy):
                return strategy
        return DynamicBatchingStrategy(name="dynamic_batching")

    @property
    def fallback_chain(self) -> FallbackChainStrategy | None:
        """The ``fallback_chain`` strategy, or None when models run on one device."""
        for strategy in self.strategies:
            if isinstance(strategy, FallbackChainStrategy):
                return strategy
        return None

    @property
    def priority_rules(self) -> tuple[PriorityRule, ...]:
        """The ``stream_priority`` rules, or no rules when that strategy is absent."""
        for strategy in self.strategies:
            if isinstance(strategy, StreamPriorityStrategy):
                return strategy.rules
        return ()
