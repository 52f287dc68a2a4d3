"""``sordino start`` as a user runs it: a real process, real signals, real files."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from importlib import resources
from pathlib import Path

import httpx
import pytest

from tests.cli.conftest import sordino_start

BUILTIN = Path(str(resources.files("sordino.models.builtin")))
PIXELS = {"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [2.0] * 64}


def test_start_serves_builtins_and_stops_on_sigterm(tmp_path: Path) -> None:
    with sordino_start([], tmp_path) as server:
        loaded = [line for line in server.lines if line.startswith("loaded ")]
        assert len(loaded) == 4
        r = httpx.post(f"{server.url}/v2/models/digits-classifier/infer", json={"inputs": [PIXELS]})
        assert r.status_code == 200
        server.process.send_signal(signal.SIGTERM)
        assert server.process.wait(timeout=60) == 0
    assert (tmp_path / "data").is_dir()


def test_start_stops_on_ctrl_c(tmp_path: Path) -> None:
    with sordino_start([], tmp_path) as server:
        server.process.send_signal(signal.SIGINT)
        assert server.process.wait(timeout=60) == 0


def test_ctrl_c_to_the_process_group_stops_workers_quietly(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the workers too; only the server decides they stop."""
    with sordino_start([], tmp_path, new_session=True) as server:
        os.killpg(server.process.pid, signal.SIGINT)
        assert server.process.wait(timeout=60) == 0
    output = "\n".join(server.lines)
    assert "stopped" in output
    assert "restarting" not in output and "killed by" not in output


def test_sigterm_during_load_answers_every_request(tmp_path: Path) -> None:
    with sordino_start([], tmp_path) as server:
        statuses: list[int] = []
        failures: list[str] = []

        def client() -> None:
            with httpx.Client(timeout=30) as c:
                for _ in range(40):
                    try:
                        r = c.post(f"{server.url}/v2/models/digits-classifier/infer",
                                   json={"inputs": [PIXELS]})  # fmt: skip
                    except httpx.ConnectError:
                        return  # the server stopped listening: nothing was accepted
                    except httpx.HTTPError as exc:  # a request accepted and then dropped
                        failures.append(repr(exc))
                        return
                    statuses.append(r.status_code)
                    if r.status_code != 200:
                        assert r.json()["error"]

        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        while len(statuses) < 20:
            threading.Event().wait(0.01)
        server.process.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(timeout=60)
        assert server.process.wait(timeout=60) == 0
    assert not failures
    assert set(statuses) <= {200, 503}


def test_model_flag_with_name(tmp_path: Path) -> None:
    model = tmp_path / "adder.onnx"
    shutil.copy(BUILTIN / "simple.onnx", model)
    with sordino_start(["--model", f"calc={model}", "--model", str(model)], tmp_path) as server:
        index = {m: httpx.get(f"{server.url}/v2/models/{m}").status_code for m in ("calc", "adder")}
        assert index == {"calc": 200, "adder": 200}
        assert httpx.get(f"{server.url}/v2/models/digits-classifier").status_code == 404


def test_model_repository_with_versions_and_config(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for version in ("1", "2"):
        (repo / "digits" / version).mkdir(parents=True)
        shutil.copy(BUILTIN / "digits-classifier.onnx", repo / "digits" / version / "model.onnx")
    (repo / "digits" / "config.yaml").write_text(
        "max_batch_size: 8\nversion_policy: {all: {}}\ndynamic_batching:\n"
        "  max_queue_delay_microseconds: 2000\n"
    )
    (repo / "text").mkdir()
    shutil.copy(BUILTIN / "text-normalizer.onnx", repo / "text" / "model.onnx")
    with sordino_start(["--model-repository", str(repo)], tmp_path) as server:
        meta = httpx.get(f"{server.url}/v2/models/digits").json()
        assert meta["versions"] == ["1", "2"]
        config = httpx.get(f"{server.url}/v2/models/digits/versions/1/config").json()
        assert config["max_batch_size"] == 8
        assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 2000
        r = httpx.post(f"{server.url}/v2/models/digits/versions/2/infer", json={"inputs": [PIXELS]})
        assert r.json()["model_version"] == "2"
        assert httpx.get(f"{server.url}/v2/models/text/ready").status_code == 200


def test_config_file_sets_mode_and_priorities(tmp_path: Path) -> None:
    config = tmp_path / "runtime_config.yaml"
    config.write_text(
        "scheduler:\n"
        '  mode: "manual"\n'
        "  strategies:\n"
        '    - name: "dynamic_batching"\n'
        "      max_batch: 4\n"
        "      timeout_ms: 5\n"
        '    - name: "stream_priority"\n'
        "      rules:\n"
        '        - tag: "premium_user" → priority: "high"\n'
    )
    with sordino_start(["--config", str(config)], tmp_path) as server:
        cfg = httpx.get(f"{server.url}/v2/models/digits-classifier/config").json()
        assert cfg["parameters"]["sordino_mode"]["string_value"] == "manual"
        assert cfg["dynamic_batching"]["max_queue_delay_microseconds"] == 5000
        body = {"inputs": [PIXELS], "parameters": {"tag": "premium_user"}}
        r = httpx.post(f"{server.url}/v2/models/digits-classifier/infer", json=body)
        assert r.status_code == 200


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("scheduler:\n  strategy: []\n", "did you mean 'strategies'"),
        ("scheduler:\n  strategies:\n    - {name: dynamic_batching, min_batch: 8, max_batch: 2}\n",
         "min_batch"),
        ("server:\n  max_request_size: lots\n", "max_request_size"),
    ],
)  # fmt: skip
def test_bad_config_stops_startup_with_clear_error(
    tmp_path: Path, content: str, needle: str
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(content)
    result = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--config", str(config), "--http-port", "0",
         "--grpc-port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert needle in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_model_file_is_clear(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--model", str(tmp_path / "nope.onnx"),
         "--http-port", "0", "--grpc-port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 2
    assert "does not exist" in result.stderr


def test_port_in_use_is_clear(tmp_path: Path) -> None:
    with sordino_start([], tmp_path) as server:
        port = server.url.rsplit(":", 1)[1]
        result = subprocess.run(
            [sys.executable, "-m", "sordino", "start", "--http-port", port, "--grpc-port", "0",
             "--data-dir", str(tmp_path / "d2")],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert result.returncode == 2
    assert "cannot listen" in result.stderr
