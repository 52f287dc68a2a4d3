"""sordino: an inference runtime for AIGC services.

It serves models over the KServe v2 protocol, batches and prioritises requests, and
explains what it does. ``sordino start`` runs the server; this package's public
surface is for embedding the runtime and testing against it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sordino.clock import Clock, MonotonicClock
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
from sordino.lazy import lazy_names

if TYPE_CHECKING:
    from sordino.config import RuntimeConfig, load_config
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

# Imported on first use: they pull in pydantic and numpy, which `sordino --help` and every
# command that only talks to a server never need (tests/cli/test_imports.py).
_LAZY = {
    "RuntimeConfig": "sordino.config",
    "load_config": "sordino.config",
    "InferRequest": "sordino.inference",
    "InferResponse": "sordino.inference",
    "ModelKey": "sordino.inference",
    "RequestedOutput": "sordino.inference",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, globals())
