"""Configuration: the schema, the unit parsers it uses, and the loader.

The schema is one module per section: ``server``, ``telemetry``, ``scheduler``,
``devices``, ``workers``, ``models``, and ``runtime`` for the root that composes
them; ``base`` holds what they share.

``load_config(path, overrides)`` is the one entry point at start-up; it returns a
frozen :class:`RuntimeConfig` or raises one :class:`sordino.errors.ConfigError` that
lists every problem. ``docs/configuration.md`` is the reference for every key.
"""

from __future__ import annotations

from sordino.config.devices import EXECUTION_PROVIDERS, DeviceConfig
from sordino.config.executor import ExecutorConfig, RayModelOptions
from sordino.config.loader import load_config, load_model_config_file, validate_config
from sordino.config.models import (
    MODEL_NAME_PATTERN,
    AllVersions,
    DynamicBatchingConfig,
    LatestVersions,
    ModelConfig,
    QueuePolicy,
    SpecificVersions,
    VersionPolicy,
)
from sordino.config.runtime import RuntimeConfig
from sordino.config.scheduler import (
    STRATEGY_NAMES,
    DynamicBatchingStrategy,
    FallbackChainStrategy,
    PriorityRule,
    SchedulerConfig,
    SchedulerMode,
    Strategy,
    StreamPriorityStrategy,
)
from sordino.config.server import MIN_TOKEN_LENGTH, ServerConfig
from sordino.config.telemetry import TelemetryConfig
from sordino.config.threshold import Threshold, parse_threshold
from sordino.config.units import Duration, Milliseconds, Size, parse_duration, parse_size
from sordino.config.workers import WorkersConfig

__all__ = [
    "EXECUTION_PROVIDERS",
    "MIN_TOKEN_LENGTH",
    "MODEL_NAME_PATTERN",
    "STRATEGY_NAMES",
    "AllVersions",
    "DeviceConfig",
    "Duration",
    "DynamicBatchingConfig",
    "DynamicBatchingStrategy",
    "ExecutorConfig",
    "FallbackChainStrategy",
    "LatestVersions",
    "Milliseconds",
    "ModelConfig",
    "PriorityRule",
    "QueuePolicy",
    "RayModelOptions",
    "RuntimeConfig",
    "SchedulerConfig",
    "SchedulerMode",
    "ServerConfig",
    "Size",
    "SpecificVersions",
    "Strategy",
    "StreamPriorityStrategy",
    "TelemetryConfig",
    "Threshold",
    "VersionPolicy",
    "WorkersConfig",
    "load_config",
    "load_model_config_file",
    "parse_duration",
    "parse_size",
    "parse_threshold",
    "validate_config",
]
