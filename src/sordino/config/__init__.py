"""Configuration: the schema, the unit parsers it uses, and the loader.

The schema is one module per section: ``server``, ``telemetry``, ``scheduler``,
``devices``, ``workers``, ``models``, and ``runtime`` for the root that composes
them; ``base`` holds what they share.

``load_config(path, overrides)`` is the one entry point at start-up; it returns a
frozen :class:`RuntimeConfig` or raises one :class:`sordino.errors.ConfigError` that
lists every problem. ``docs/configuration.md`` is the reference for every key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sordino.lazy import lazy_names

if TYPE_CHECKING:
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

# Each name is imported from its module on first use (PEP 562), so that importing one
# section (a worker process needs ``sordino.config.memory`` alone) does not import the
# loader and every other section's schema: about a second of a worker's start-up.
_HOMES = {
    "AllVersions": "sordino.config.models",
    "DeviceConfig": "sordino.config.devices",
    "Duration": "sordino.config.units",
    "DynamicBatchingConfig": "sordino.config.models",
    "DynamicBatchingStrategy": "sordino.config.scheduler",
    "EXECUTION_PROVIDERS": "sordino.config.devices",
    "ExecutorConfig": "sordino.config.executor",
    "FallbackChainStrategy": "sordino.config.scheduler",
    "LatestVersions": "sordino.config.models",
    "MIN_TOKEN_LENGTH": "sordino.config.server",
    "MODEL_NAME_PATTERN": "sordino.config.models",
    "Milliseconds": "sordino.config.units",
    "ModelConfig": "sordino.config.models",
    "PriorityRule": "sordino.config.scheduler",
    "QueuePolicy": "sordino.config.models",
    "RayModelOptions": "sordino.config.executor",
    "RuntimeConfig": "sordino.config.runtime",
    "STRATEGY_NAMES": "sordino.config.scheduler",
    "SchedulerConfig": "sordino.config.scheduler",
    "SchedulerMode": "sordino.config.scheduler",
    "ServerConfig": "sordino.config.server",
    "Size": "sordino.config.units",
    "SpecificVersions": "sordino.config.models",
    "Strategy": "sordino.config.scheduler",
    "StreamPriorityStrategy": "sordino.config.scheduler",
    "TelemetryConfig": "sordino.config.telemetry",
    "Threshold": "sordino.config.threshold",
    "VersionPolicy": "sordino.config.models",
    "WorkersConfig": "sordino.config.workers",
    "load_config": "sordino.config.loader",
    "load_model_config_file": "sordino.config.loader",
    "parse_duration": "sordino.config.units",
    "parse_size": "sordino.config.units",
    "parse_threshold": "sordino.config.threshold",
    "validate_config": "sordino.config.loader",
}


__getattr__, __dir__ = lazy_names(__name__, _HOMES, globals())

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
