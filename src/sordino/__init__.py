"""sordino: an inference runtime for AIGC services.

It serves models over the KServe v2 protocol, batches and prioritises requests, and
explains what it does. ``sordino start`` runs the server; this package's public
surface is for embedding the runtime and testing against it.
"""

from __future__ import annotations

from sordino.clock import Clock, MonotonicClock
from sordino.config import RuntimeConfig, load_config
from sordino.errors import (
    Cancelled,
    ConfigError,
    Forbidden,
    InferenceFailed,
    InvalidRequest,
    MalformedBody,
    ModelLoadError,
    ModelNotReady,
    NotFound,
    QueueFull,
    QueueTimeout,
    RateLimited,
    ShuttingDown,
    SordinoError,
    TensorError,
    Unauthenticated,
    Unavailable,
    Unsupported,
)
from sordino.events import Event, EventSink
from sordino.inference import InferRequest, InferResponse, ModelKey, RequestedOutput

__version__ = "0.1.0"

__all__ = [
    "Cancelled",
    "Clock",
    "ConfigError",
    "Event",
    "EventSink",
    "Forbidden",
    "InferRequest",
    "InferResponse",
    "InferenceFailed",
    "InvalidRequest",
    "MalformedBody",
    "ModelKey",
    "ModelLoadError",
    "ModelNotReady",
    "MonotonicClock",
    "NotFound",
    "QueueFull",
    "QueueTimeout",
    "RateLimited",
    "RequestedOutput",
    "RuntimeConfig",
    "ShuttingDown",
    "SordinoError",
    "TensorError",
    "Unauthenticated",
    "Unavailable",
    "Unsupported",
    "__version__",
    "load_config",
]
