"""A repository's Triton ensembles under model control, as Triton 2.51 treats them
(``bench/triton_python_parity.py`` compares the same sequence with Triton itself):
loaded with the models they run, out of service while one of those is not, back when
it is, unloaded with ``unload_dependents``, rebuilt when their configuration changed,
and followed by a polled repository."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from sordino.config import RuntimeConfig, load_config
from sordino.control.client import ClientError, request_json
from sordino.models.ensembles import ensemble_pipeline
from sordino.models.repository import builtin_sources, scan_repository
from sordino.server.model_control import ModelControl
from sordino.server.runtime import Runtime
from sordino.testing import RunningServer, serve_in_thread
from tests.server.test_ensembles import CHAIN, _ask, _config, _repository

SLOW = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(1.0)
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
            )
            for r in requests
        ]
"""


def _explicit(root: Path) -> RuntimeConfig:
    """Explicit model control with nothing of the repository loaded at start-up (as
    ``sordino start`` without ``--load-model``)."""
    return load_config(
        None, {"model_repository": str(root), "server.model_control_mode": "explicit"}
    )


def _simple() -> list[Any]:
    return [s for s in builtin_sources() if s.name == "simple"]


def _index(server: RunningServer) -> dict[str, tuple[str, str, str]]:
    entries = request_json("POST", f"{server.url}/v2/repository/index", {}, timeout=10)
    return {
        e["name"]: (e.get("version", ""), e.get("state", ""), e.get("reason", "")) for e in entries
    }


def _post(server: RunningServer, path: str, body: dict[str, Any] | None = None) -> None:
    request_json("POST", f"{server.url}/v2/repository/models/{path}", body or {}, timeout=60)


def _answers(server: RunningServer) -> bool:
    p = np.arange(16, dtype=np.int32).reshape(1, 16)
    s = p + p
    np.testing.assert_array_equal(_ask(server.url, "chain", p, p), s - s.sum(axis=0))
    return True


def test_an_ensemble_loads_with_its_models_and_leaves_with_them(tmp_path: Path) -> None:
    root = _repository(tmp_path / "models")
    # The built-in simple model only.
    with serve_in_thread(_explicit(root), _simple()) as server:
        assert _index(server) == {
            "centred": ("", "", ""),  # never loaded: a name alone, as on Triton
            "chain": ("", "", ""),
            "simple": ("1", "READY", ""),
        }
        _post(server, "chain/load")  # brings centred, which it runs
        assert _index(server)["centred"] == _index(server)["chain"] == ("1", "READY", "")
        assert _answers(server)
        _post(server, "chain/load")  # unchanged: nothing happens
        # A model the ensemble runs leaves: the ensemble leaves first ...
        _post(server, "centred/unload")
        assert _index(server)["chain"] == ("1", "UNAVAILABLE", "unloaded")
        with pytest.raises(ClientError, match="404"):
            _answers(server)
        # ... and comes back with it.
        _post(server, "centred/load")
        assert _index(server)["chain"] == ("1", "READY", "")
        assert _answers(server)
        # centred was loaded by name: unload_dependents leaves it, as Triton does.
        _post(server, "chain/unload", {"parameters": {"unload_dependents": True}})
        index = _index(server)
        assert index["centred"] == ("1", "READY", "")
        assert index["chain"] == ("1", "UNAVAILABLE", "unloaded")
        _post(server, "centred/unload")
        _post(server, "chain/load")
        _post(server, "chain/unload", {"parameters": {"unload_dependents": True}})
        index = _index(server)
        assert index["centred"] == ("1", "UNAVAILABLE", "unloaded")  # loaded for chain only
        assert server.runtime.versions("simple") == ["1"]  # not a repository model: stays
        with pytest.raises(ClientError, match="'unload_dependents' must be true or false"):
            _post(server, "chain/unload", {"parameters": {"unload_dependents": "yes"}})


def test_a_request_inside_an_ensemble_finishes_when_its_step_is_unloaded(
    tmp_path: Path,
) -> None:
    """The ensemble drains before the model it runs leaves: a request already past the
    ensemble's admission still gets its answer."""
    root = _repository(tmp_path / "models")
    (root / "centred" / "1" / "model.py").write_text(SLOW)
    with serve_in_thread(_explicit(root), _simple()) as server:
        _post(server, "chain/load")
        answers: list[np.ndarray] = []
        p = np.ones((1, 16), np.int32)
        asking = threading.Thread(target=lambda: answers.append(_ask(server.url, "chain", p, p)))
        asking.start()
        while not server.runtime.get("centred").scheduler.statistics().in_flight:
            threading.Event().wait(0.01)
        _post(server, "centred/unload")
        asking.join(30)
        np.testing.assert_array_equal(answers[0], p + p)
        assert _index(server)["centred"] == ("1", "UNAVAILABLE", "unloaded")


def test_an_edited_ensemble_is_rebuilt_and_a_broken_one_refused(tmp_path: Path) -> None:
    root = _repository(tmp_path / "models")
    with serve_in_thread(_explicit(root), _simple()) as server:
        _post(server, "chain/load")
        config = root / "chain" / "config.pbtxt"
        config.write_text(CHAIN.replace("max_batch_size: 8", "max_batch_size: 4"))
        _post(server, "chain/load")
        found = request_json("GET", f"{server.url}/v2/models/chain/config", timeout=10)
        assert found["max_batch_size"] == 4
        assert _answers(server)
        # A reload that fails leaves the ensemble served as it was (as on Triton) ...
        config.write_text(CHAIN.replace('value: "R"', 'value: "Z"'))
        with pytest.raises(ClientError, match="ensemble output 'R' is produced by no step"):
            _post(server, "chain/load")
        assert _index(server)["chain"] == ("1", "READY", "")
        assert _answers(server)
        # ... and once unloaded, the index says why it cannot load.
        _post(server, "chain/unload")
        with pytest.raises(ClientError, match="ensemble output 'R' is produced by no step"):
            _post(server, "chain/load")
        version, state, reason = _index(server)["chain"]
        assert (version, state) == ("", "UNAVAILABLE")
        assert "ensemble output 'R' is produced by no step" in reason
        config.write_text(CHAIN)
        _post(server, "chain/load")
        assert _answers(server)


def test_a_pipeline_of_the_configuration_is_not_loaded_or_unloaded(tmp_path: Path) -> None:
    """The pipelines section is the configuration's: served from start-up on."""
    root = _repository(tmp_path / "models")
    shutil.move(root / "chain", tmp_path / "chain")
    config = _explicit(root)
    config = config.model_copy(update={"pipelines": (ensemble_pipeline(tmp_path / "chain"),)})
    with serve_in_thread(config, [*_simple(), *scan_repository(root)]) as server:
        for action in ("load", "unload"):
            with pytest.raises(ClientError, match="'chain' is a pipeline of the configuration"):
                _post(server, f"chain/{action}")
        assert _answers(server)


async def test_a_polled_repository_brings_and_takes_its_ensembles(tmp_path: Path) -> None:
    root = _repository(tmp_path / "models")
    config = _config(root, model_control_mode="poll", repository_poll_secs=3600)
    runtime = Runtime(config, [*_simple(), *scan_repository(root)])
    control = ModelControl(runtime)
    await runtime.start()
    control.start()
    try:
        assert runtime.versions("chain") == ["1"]
        shutil.move(root / "chain", tmp_path / "chain")
        await control.poll_once()
        assert runtime.versions("chain") == []
        shutil.move(tmp_path / "chain", root / "chain")
        await control.poll_once()
        assert runtime.versions("chain") == ["1"]
        # The model it runs leaves the repository: the ensemble leaves with it.
        shutil.move(root / "centred", tmp_path / "centred")
        await control.poll_once()
        assert runtime.versions("chain") == [] and runtime.versions("centred") == []
        shutil.move(tmp_path / "centred", root / "centred")
        await control.poll_once()
        assert runtime.versions("chain") == ["1"]
    finally:
        await control.close()
        await runtime.stop()


def test_an_ensemble_with_a_response_cache_answers_again_without_its_steps(
    tmp_path: Path,
) -> None:
    """Triton caches a top-level request to an ensemble that enables response_cache."""
    root = _repository(tmp_path / "models")
    text = CHAIN + "\nresponse_cache { enable: true }\n"
    (root / "chain" / "config.pbtxt").write_text(text)
    config = _config(root).model_copy(
        update={"server": load_config(None, {"server.response_cache_size": 1 << 20}).server}
    )
    with serve_in_thread(config, [*_simple(), *scan_repository(root)]) as server:
        for _ in range(3):
            assert _answers(server)
        stats = request_json("GET", f"{server.url}/v2/models/chain/stats", timeout=10)
        steps = request_json("GET", f"{server.url}/v2/models/centred/stats", timeout=10)
        found = request_json("GET", f"{server.url}/v2/models/chain/config", timeout=10)
    figures = stats["model_stats"][0]["inference_stats"]
    assert (figures["cache_hit"]["count"], figures["cache_miss"]["count"]) == (2, 1)
    assert figures["success"]["count"] == 3
    assert steps["model_stats"][0]["inference_count"] == 1  # the steps ran once
    assert found["response_cache"] == {"enable": True}
