"""``sordino quantize`` and the accuracy guard of ``--quant-aware`` on the digits classifier."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from sklearn.datasets import load_digits

from sordino.cli.main import cli
from sordino.config import ModelConfig, load_config
from sordino.events import Event
from sordino.models.repository import builtin_sources, sources_for
from sordino.testing import serve_in_thread
from tests.cli.conftest import sordino_start
from tests.waiting import wait_for

DIGITS = next(s.path for s in builtin_sources() if s.name == "digits-classifier")


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


@pytest.fixture(scope="module")
def int8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("quant")
    data = folder / "digits.npz"
    np.savez(data, pixels=load_digits().data.astype(np.float32)[:600])
    out = folder / "digits_int8.onnx"
    code, text = _cli("quantize", str(DIGITS), "--int8", "--calibration", str(data), "-o", str(out))
    assert code == 0, text
    assert "(static INT8): on 64 held-out rows top-1 agreement 100.0%" in text
    return out


def _broken(int8: Path, target: Path) -> Path:
    """The quantized model with its INT8 weights scrambled (its hints kept)."""
    model = onnx.load(str(int8))
    rng = np.random.default_rng(1)
    for tensor in model.graph.initializer:
        if tensor.data_type == onnx.TensorProto.INT8:
            array = onnx.numpy_helper.to_array(tensor)
            scrambled = rng.integers(-127, 127, array.shape, dtype=np.int8)
            tensor.CopyFrom(onnx.numpy_helper.from_array(scrambled, tensor.name))
    onnx.save(model, str(target))
    return target


def test_quantize_embeds_the_guard_hints(int8: Path) -> None:
    code, out = _cli("hints", "show", str(int8))
    assert code == 0
    assert "sordino.hints.precision = int8" in out
    assert f"sordino.hints.float_reference = {DIGITS.resolve()}" in out
    assert "sordino.hints.accuracy_bound = 0.99" in out and "guard_sample" in out
    code, out = _cli("quantize", str(DIGITS), "--int8", "-o", str(int8.parent / "x.onnx"))
    assert code == 2 and "exactly one of --calibration" in out


def test_guard_falls_back_to_float_on_a_broken_int8_model(int8: Path, tmp_path: Path) -> None:
    broken = _broken(int8, tmp_path / "broken_int8.onnx")
    config = load_config(None, {"quant_guard.enabled": True})
    sources = sources_for(ModelConfig(name="digits8", path=broken))
    with serve_in_thread(config, sources) as server:
        assert server.runtime.get("digits8").source.path == DIGITS
        [event] = server.runtime.events.recent("quant_guard")
        assert event.payload["action"] == "fallback_to_float"
        assert event.payload["agreement"] < 0.99
        with urllib.request.urlopen(f"{server.url}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert 'sordino_quant_guard_fallbacks_total{model="digits8"} 1.0' in metrics


def test_a_good_int8_model_is_served_and_rechecked(int8: Path) -> None:
    config = load_config(None, {"quant_guard.enabled": True, "quant_guard.interval": 0.2})
    sources = sources_for(ModelConfig(name="digits8", path=int8))
    with serve_in_thread(config, sources) as server:
        assert server.runtime.get("digits8").source.path == int8

        def periodic() -> list[Event]:
            events = server.runtime.events.recent("quant_guard")
            return [e for e in events if e.payload["phase"] == "periodic"]

        wait_for(periodic, "a periodic check through the served model")
        first = periodic()[0].payload
        assert first["action"] == "kept" and first["agreement"] == 1.0


def test_start_quant_aware_says_it_serves_float(int8: Path, tmp_path: Path) -> None:
    broken = _broken(int8, tmp_path / "broken_int8.onnx")
    args = ["--model", f"digits8={broken}", "--quant-aware", "true"]
    with sordino_start(args, tmp_path) as server:
        pass
    log = "\n".join(server.lines)
    assert "model digits8: the quantized model strays from its float reference" in log
    assert "serving the float model instead" in log
