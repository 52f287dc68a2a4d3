"""Triton's response cache: ``response_cache { enable: true }`` with ``--cache-config
local,size=BYTES`` answers a request whose inputs were answered before without running
the model, and counts it as Triton does (``bench/triton_python_parity.py`` compares the
counts with Triton's own)."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from sordino.config import ModelConfig, load_config
from sordino.errors import ModelLoadError
from sordino.inference import ModelKey
from sordino.models.repository import scan_repository
from sordino.server.response_cache import ResponseCache
from sordino.testing import serve_in_thread

FIXTURE = Path(__file__).parent.parent / "fixtures" / "triton_python_answers" / "cached"
"""It answers Y = 2 X and RUNS, how many requests it has run; its config.pbtxt enables
response_cache (the parity bench serves it too)."""


def _repository(root: Path, extra: str = "") -> Path:
    shutil.copytree(FIXTURE, root / "cached")
    config = root / "cached" / "config.pbtxt"
    config.write_text(config.read_text() + extra)
    return root


def _ask(client: httpclient.InferenceServerClient, x: list[float], *outputs: str) -> dict:
    tensor = httpclient.InferInput("X", [4], "FP32")
    tensor.set_data_from_numpy(np.array(x, np.float32))
    asked = [httpclient.InferRequestedOutput(name) for name in outputs] or None
    result = client.infer("cached", [tensor], outputs=asked)
    return {o["name"]: result.as_numpy(o["name"]) for o in result.get_response()["outputs"]}


def test_a_request_answered_before_is_answered_from_the_cache(tmp_path: Path) -> None:
    root = _repository(tmp_path / "models")
    config = load_config(
        None, {"model_repository": str(root), "server.response_cache_size": 1 << 20}
    )
    with serve_in_thread(config, scan_repository(root)) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        first = _ask(client, [1, 2, 3, 4])
        again = _ask(client, [1, 2, 3, 4])
        assert first["RUNS"].tolist() == again["RUNS"].tolist() == [1]  # ran once
        np.testing.assert_array_equal(again["Y"], [2, 4, 6, 8])
        # Fewer outputs asked for: the cached answer gives what is asked, no more.
        assert list(_ask(client, [1, 2, 3, 4], "Y")) == ["Y"]
        assert _ask(client, [1, 2, 3, 5])["RUNS"].tolist() == [2]  # other inputs: runs
        # gRPC reads the same cache.
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput("X", [4], "FP32")
        tensor.set_data_from_numpy(np.array([1, 2, 3, 4], np.float32))
        assert grpc.infer("cached", [tensor]).as_numpy("RUNS").tolist() == [1]
        stats = client.get_inference_statistics("cached")["model_stats"][0]
        with urllib.request.urlopen(f"{server.url}/v2/models/cached/config") as answer:
            found = json.loads(answer.read())
        metrics = urllib.request.urlopen(f"{server.url}/metrics", timeout=10).read().decode()
    # As Triton counts: every request a success, only those run inferences.
    assert (stats["inference_count"], stats["execution_count"]) == (2, 2)
    figures = stats["inference_stats"]
    assert figures["success"]["count"] == 5
    assert (figures["cache_hit"]["count"], figures["cache_miss"]["count"]) == (3, 2)
    assert figures["compute_infer"]["count"] == 2
    assert found["response_cache"] == {"enable": True}
    assert 'nv_cache_num_hits_per_model{model="cached",version="1"} 3.0' in metrics
    assert "nv_cache_num_entries 2.0" in metrics


def test_without_a_server_cache_every_request_runs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """As Triton without --cache-config: the model loads, and says nothing is kept."""
    root = _repository(tmp_path / "models")
    config = load_config(None, {"model_repository": str(root)})
    with caplog.at_level(logging.WARNING), serve_in_thread(config, scan_repository(root)) as s:
        client = httpclient.InferenceServerClient(s.url.removeprefix("http://"))
        runs = [_ask(client, [1, 2, 3, 4])["RUNS"].tolist() for _ in range(2)]
        metrics = urllib.request.urlopen(f"{s.url}/metrics", timeout=10).read().decode()
    assert runs == [[1], [2]]
    assert "the server has no response cache" in caplog.text
    assert "nv_cache_num_hits_per_model" not in metrics


def test_a_decoupled_model_with_a_response_cache_is_refused(tmp_path: Path) -> None:
    root = _repository(tmp_path / "models", "model_transaction_policy { decoupled: true }\n")
    config = load_config(
        None, {"model_repository": str(root), "server.response_cache_size": 1 << 20}
    )
    with (
        pytest.raises(ModelLoadError, match="response_cache is not supported for a decoupled"),
        serve_in_thread(config, scan_repository(root)),
    ):
        pass


@pytest.mark.parametrize("kind", ["sequence_batching", "streaming"])
def test_a_model_whose_answers_depend_on_more_than_its_inputs_is_refused(kind: str) -> None:
    given = {
        "sequence_batching": {"max_sequence_idle_microseconds": 1000},
        "streaming": {"carry": {"STATE_OUT": "STATE"}, "done": "DONE"},
    }
    with pytest.raises(
        ValueError, match=f"response_cache is not supported for a model with {kind}"
    ):
        ModelConfig(name="m", response_cache=True, **{kind: given[kind]})


def test_the_cache_keys_on_every_input_fact_and_keeps_its_size() -> None:
    key = ResponseCache.key
    model = ModelKey("m", "1")
    x = {"X": np.arange(4, dtype=np.float32)}
    assert key(model, x) == key(model, {"X": np.arange(4, dtype=np.float32)})
    for other in (
        {"X": np.arange(4, dtype=np.float64)},  # datatype
        {"X": np.arange(4, dtype=np.float32).reshape(2, 2)},  # shape
        {"X": np.arange(1, 5, dtype=np.float32)},  # bytes
        {"Z": np.arange(4, dtype=np.float32)},  # name
    ):
        assert key(model, other) != key(model, x)
    assert key(ModelKey("m", "2"), x) != key(model, x)  # version
    words = np.array([b"ab", b"c"], dtype=object)
    assert key(model, {"S": words}) != key(model, {"S": np.array([b"a", b"bc"], dtype=object)})

    cache = ResponseCache(size=600)
    out = {"Y": np.zeros(50, np.float32)}  # 200 bytes and the entry's own
    for n in range(3):
        assert cache.put(model, bytes([n]), out)
    assert cache.get(b"\x00") is None  # the least recently used left for the third
    kept = cache.get(b"\x01")
    assert kept is not None and not kept["Y"].flags.writeable
    assert not cache.put(model, b"big", {"Y": np.zeros(1000, np.float32)})  # larger than all
    figures = cache.statistics()
    assert (figures.entries, figures.evictions, figures.hits, figures.misses) == (2, 1, 1, 1)
    cache.put(ModelKey("other", "1"), b"o", out)  # (the second entry of m leaves for it)
    cache.forget(model)  # m unloaded: its answers go, the other model's stay
    assert cache.get(b"\x02") is None and cache.get(b"o") is not None
    assert cache.statistics().entries == 1


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("redis,host=127.0.0.1", "cache 'redis' is not supported"),
        ("local,bytes=10", "the local cache takes one setting, size"),
        ("local,size=lots", "invalid size 'lots'"),
    ],
)
def test_a_cache_config_sordino_does_not_have_is_refused(
    tmp_path: Path, value: str, said: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--cache-config", value,
         "--data-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert said in done.stderr and "Traceback" not in done.stderr
