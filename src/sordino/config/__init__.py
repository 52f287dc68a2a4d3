"""Configuration: the schema, the unit parsers it uses, and the loader.

``load_config(path, overrides)`` is the one entry point at start-up; it returns a
frozen :class:`RuntimeConfig` or raises one :class:`sordino.errors.ConfigError` that
lists every problem. ``docs/configuration.md`` is the reference for every key.
"""

from __future__ import annotations

from sordino.config.loader import load_config, load_model_config_file, validate_config
from sordino.config.schema import (
    EXECUTION_PROVIDERS,
    STRATEGY_NAMES,
    AllVersions,
    DeviceConfig,
    DynamicBatchingConfig,
    DynamicBatchingStrategy,
    FallbackChainStrategy,
    LatestVersions,
    ModelConfig,
    PriorityRule,
    QueuePolicy,
    RuntimeConfig,
    SchedulerConfig,
    SchedulerMode,
    ServerConfig,
    SpecificVersions,
    Strategy,
    StreamPriorityStrategy,
    TelemetryConfig,
    VersionPolicy,
    WorkersConfig,
)
from sordino.config.threshold import Threshold, parse_threshold
from sordino.config.units import Duration, Milliseconds, Size, parse_duration, parse_size

__all__ = [
    "EXECUTION_PROVIDERS",
    "STRATEGY_NAMES",
    "AllVersions",
    "DeviceConfig",
    "Duration",
    "DynamicBatchingConfig",
    "DynamicBatchingStrategy",
    "FallbackChainStrategy",
    "LatestVersions",
    "Milliseconds",
    "ModelConfig",
    "PriorityRule",
    "QueuePolicy",
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
