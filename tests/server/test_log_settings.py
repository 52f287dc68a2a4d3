"""Triton's logging extension: ``GET``/``POST /v2/logging`` and the ``LogSettings`` RPC
read and change the server process's log as Triton's settings name it."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.errors import InvalidRequest, Unsupported
from sordino.models.repository import scan_repository
from sordino.telemetry import log_settings
from sordino.telemetry.log_settings import LogSettings
from sordino.testing import serve_in_thread
from tests.waiting import wait_for

TRITON_DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


@pytest.fixture
def logger() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    written = io.StringIO()
    logger = logging.getLogger("test-log-settings")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(written)
    logger.addHandler(handler)
    yield logger, written
    logger.removeHandler(handler)


def test_the_settings_switch_severities_verbosity_and_the_time_format(
    logger: tuple[logging.Logger, io.StringIO],
) -> None:
    log, written = logger
    settings = LogSettings(log)
    assert settings.current() == TRITON_DEFAULTS  # from the level INFO
    settings.update({"log_info": False})
    log.info("an info line")
    log.warning("a warning line")
    settings.update({"log_verbose_level": 1, "log_info": True})
    log.debug("a debug line")
    settings.update({"log_verbose_level": 0, "log_format": "ISO8601"})
    log.debug("no debug line")
    log.error("an error line")
    lines = written.getvalue().splitlines()
    assert [line.split(": ", 1)[1] for line in lines] == [
        "a warning line",
        "a debug line",
        "an error line",
    ]
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ERROR test-log-settings: ", lines[-1])
    assert settings.current()["log_format"] == "ISO8601"


@pytest.mark.parametrize(
    ("change", "error", "said"),
    [
        ({"log_file": "/tmp/x.log"}, Unsupported, "log_file cannot be changed"),
        ({"log_level": 1}, InvalidRequest, "unknown log setting 'log_level'; the settings"),
        ({"log_info": "yes"}, InvalidRequest, "log_info must be true or false"),
        ({"log_verbose_level": -1}, InvalidRequest, "log_verbose_level must be a whole number"),
        ({"log_format": "xml"}, InvalidRequest, "log_format must be default or ISO8601"),
    ],
)
def test_a_change_sordino_cannot_make_is_refused_and_nothing_changes(
    logger: tuple[logging.Logger, io.StringIO], change: dict, error: type, said: str
) -> None:
    settings = LogSettings(logger[0])
    with pytest.raises(error, match=said):
        settings.update({"log_verbose_level": 2, **change})
    assert settings.current() == TRITON_DEFAULTS  # checked before anything applied


@pytest.fixture
def process_log() -> Iterator[None]:
    """The process's own settings, put back as they were after the test."""
    root = logging.getLogger()
    level = root.level
    kept = [(h, list(h.filters), h.formatter) for h in root.handlers]
    log_settings._PROCESS = None
    yield
    log_settings._PROCESS = None
    root.setLevel(level)
    for handler, filters, formatter in kept:
        handler.filters[:] = filters
        handler.setFormatter(formatter)


def test_http_and_grpc_read_and_change_the_same_settings(process_log: None) -> None:
    logging.getLogger().setLevel(logging.INFO)
    with serve_in_thread() as server:
        http = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert http.get_log_settings() == TRITON_DEFAULTS
        changed = http.update_log_settings({"log_verbose_level": 1})
        assert changed == {**TRITON_DEFAULTS, "log_verbose_level": 1}
        read = grpc.get_log_settings(as_json=True)["settings"]
        assert read["log_verbose_level"] == {"uint32_param": 1}
        assert read["log_info"] == {"bool_param": True}
        back = grpc.update_log_settings({"log_verbose_level": 0, "log_format": "ISO8601"})
        assert back.settings["log_format"].string_param == "ISO8601"
        assert http.get_log_settings()["log_verbose_level"] == 0
        with pytest.raises(InferenceServerException, match="log_file cannot be changed"):
            http.update_log_settings({"log_file": "/tmp/x.log"})
        with pytest.raises(InferenceServerException, match="unknown log setting") as info:
            grpc.update_log_settings({"nope": True})
        assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "logging" in http.get_server_metadata()["extensions"]


TALKER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.Logger.log_info("talker: info at initialize")

    def execute(self, requests):
        pb_utils.Logger.log_info("talker: info at execute")
        pb_utils.Logger.log_verbose("talker: verbose at execute")
        pb_utils.Logger.log_warn("talker: warning at execute")
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""


def test_a_python_models_log_lines_in_its_worker_follow_the_settings(
    process_log: None, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A model's pb_utils.Logger lines in its worker process: info shown from the start
    (Python would keep only warnings there), verbose once log_verbose_level is 1, info
    gone once log_info is false — as Triton's model logs follow its settings."""
    folder = tmp_path / "talker"
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 4\n'
        'input [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
    )
    (folder / "1" / "model.py").write_text(TALKER)
    logging.getLogger().setLevel(logging.INFO)
    body = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}

    def lines_after(change: dict[str, object] | None) -> list[tuple[str, str]]:
        """The model's lines of one request (its warning, always written, comes last)."""
        if change is not None:
            assert httpx.post(f"{server.url}/v2/logging", json=change).status_code == 200
        capfd.readouterr()
        assert httpx.post(f"{server.url}/v2/models/talker/infer", json=body).status_code == 200
        written: list[str] = []

        def warned() -> bool:
            written.append(capfd.readouterr().err)
            return "warning at execute" in "".join(written)

        wait_for(warned, "the worker's warning line")
        return re.findall(r"talker: (\w+) at (\w+)", "".join(written))

    with serve_in_thread(None, scan_repository(tmp_path)) as server:
        assert "talker: info at initialize" in capfd.readouterr().err
        assert lines_after(None) == [("info", "execute"), ("warning", "execute")]
        verbose = lines_after({"log_verbose_level": 1})
        assert verbose == [("info", "execute"), ("verbose", "execute"), ("warning", "execute")]
        assert lines_after({"log_info": False, "log_verbose_level": 0}) == [("warning", "execute")]
