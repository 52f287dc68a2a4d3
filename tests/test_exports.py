"""The public surface of the package is exactly what __all__ says."""

from __future__ import annotations

import sordino
import sordino.testing


def test_package_exports() -> None:
    assert set(sordino.__all__) == {
        "Cancelled", "Clock", "ConfigError", "Event", "EventSink", "Forbidden",
        "InferRequest", "InferResponse", "InferenceFailed", "InvalidRequest", "MalformedBody",
        "ModelKey", "ModelLoadError", "ModelNotReady", "MonotonicClock", "NotFound",
        "QueueFull", "QueueTimeout", "RateLimited", "RequestedOutput", "RuntimeConfig",
        "ShuttingDown", "SordinoError", "TensorError", "Unauthenticated", "Unavailable",
        "Unsupported", "__version__", "load_config",
    }  # fmt: skip
    for name in sordino.__all__:
        assert hasattr(sordino, name), name


def test_testing_exports() -> None:
    assert set(sordino.testing.__all__) == {
        "RunningServer", "ScriptedExecutor", "VirtualClock", "serve_in_thread",
        "Fragmentation", "fragment_arena",
        "TinyKServe", "serve_tiny_kserve",
    }  # fmt: skip


def test_every_error_is_a_sordino_error() -> None:
    for name in sordino.__all__:
        obj = getattr(sordino, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, sordino.SordinoError), name
