"""The gRPC port and model-control keys of the server section."""

from __future__ import annotations

from pathlib import Path

import pytest

from sordino.config import load_config
from sordino.errors import ConfigError


def test_defaults_follow_triton() -> None:
    server = load_config().server
    assert server.grpc_port == 8001
    assert server.model_control_mode == "none"
    assert server.repository_poll_secs == 15.0


def test_keys_from_overrides(tmp_path: Path) -> None:
    config = load_config(
        None,
        {
            "server.grpc_port": 0,
            "server.model_control_mode": "poll",
            "server.repository_poll_secs": "2m",
            "model_repository": str(tmp_path),
        },
    )
    assert config.server.grpc_port == 0
    assert config.server.repository_poll_secs == 120.0


def test_poll_needs_a_repository() -> None:
    """The error names the flag to add, not "(top level)" and the whole configuration."""
    with pytest.raises(ConfigError) as failure:
        load_config(None, {"server.model_control_mode": "poll"})
    assert str(failure.value).splitlines()[1:] == [
        "  server.model_control_mode: poll rescans a model repository, but none is given: "
        "pass --model-repository DIR (model_repository in a config file), or use the mode "
        "explicit"
    ]


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ConfigError, match="model_control_mode"):
        load_config(None, {"server.model_control_mode": "manual"})


def test_streaming_section_checked() -> None:
    with pytest.raises(ConfigError, match="carry"):
        load_config(None, {"models": [{"name": "m", "path": "m.onnx", "streaming": {"done": "D"}}]})
