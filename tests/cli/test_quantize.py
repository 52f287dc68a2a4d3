"""``sordino quantize`` and the accuracy guard of ``--quant-aware`` on the digits classifier."""

from __future__ import annotations

import base64
import io
import json
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from sklearn.datasets import load_digits

from sordino.cli.main import cli
from sordino.config import ModelConfig, load_config
from sordino.errors import ModelLoadError
from sordino.events import Event
from sordino.models.repository import builtin_sources, sources_for
from sordino.testing import serve_in_thread
from tests.cli.conftest import sordino_start
from tests.waiting import wait_for

DIGITS = next(s.path for s in builtin_sources() if s.name == "digits-classifier")
FLOAT = "digits_int8.float.onnx"


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


@pytest.fixture(scope="module")
def int4(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("quant4")
    sample = folder / "held_out.npz"
    np.savez(sample, pixels=load_digits().data.astype(np.float32)[-64:])
    out = folder / "digits_int4.onnx"
    code, text = _cli("quantize", str(DIGITS), "--int4", "--sample", str(sample), "-o", str(out))
    assert code == 0, text
    assert "(INT4 weight-only, 2 MatMul weight(s), block size 32)" in text, text
    assert "on 64 held-out rows top-1 agreement 100.0%" in text, text
    return out


def test_int4_is_matmulnbits_with_the_guard_hints(int4: Path) -> None:
    model = onnx.load(str(int4))
    ops = [node.op_type for node in model.graph.node]
    assert ops.count("MatMulNBits") == 2 and "Gemm" not in ops, ops
    [bits] = {a.i for n in model.graph.node for a in n.attribute if a.name == "bits"}
    assert bits == 4
    code, out = _cli("hints", "show", str(int4))
    assert code == 0
    assert "sordino.hints.precision = int4" in out
    assert "sordino.hints.float_reference = digits_int4.float.onnx" in out


def test_a_good_int4_model_is_served_and_answers_like_the_float(int4: Path) -> None:
    config = load_config(None, {"quant_guard.enabled": True})
    sources = sources_for(ModelConfig(name="digits4", path=int4))
    with serve_in_thread(config, sources) as server:
        assert server.runtime.get("digits4").source.path == int4
        [event] = server.runtime.events.recent("quant_guard")
        assert event.payload["action"] == "kept" and event.payload["agreement"] >= 0.99
        pixels = load_digits().data.astype(np.float32)[-8:]
        body = {"inputs": [{"name": "pixels", "shape": [8, 64], "datatype": "FP32",
                            "data": pixels.ravel().tolist()}]}  # fmt: skip
        request = urllib.request.Request(
            f"{server.url}/v2/models/digits4/infer",
            json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            answer = json.loads(response.read())
    [output] = [o for o in answer["outputs"] if o["shape"] == [8, 10]]
    served = np.asarray(output["data"], dtype=np.float32).reshape(8, 10)
    import onnxruntime as ort

    reference = ort.InferenceSession(str(DIGITS), providers=["CPUExecutionProvider"])
    [expected] = reference.run(None, {"pixels": pixels})[:1]
    assert (served.argmax(axis=1) == expected.argmax(axis=1)).all()


def test_start_quant_aware_falls_back_from_a_broken_int4_model(int4: Path, tmp_path: Path) -> None:
    shutil.copyfile(int4.parent / "digits_int4.float.onnx", tmp_path / "digits_int4.float.onnx")
    model = onnx.load(str(int4))
    rng = np.random.default_rng(1)
    for tensor in model.graph.initializer:
        if tensor.name.endswith("_int4_B"):
            array = onnx.numpy_helper.to_array(tensor)
            scrambled = rng.integers(0, 255, array.shape, dtype=np.uint8)
            tensor.CopyFrom(onnx.numpy_helper.from_array(scrambled, tensor.name))
    broken = tmp_path / "digits_int4.onnx"
    onnx.save(model, str(broken))
    args = ["--model", f"digits4={broken}", "--quant-aware", "true"]
    with sordino_start(args, tmp_path) as server:
        pass
    log = "\n".join(server.lines)
    assert "model digits4: the quantized model strays from its float reference" in log
    assert "serving the float model instead" in log


def test_int4_of_a_plain_matmul_model_and_of_one_without_any(tmp_path: Path) -> None:
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((48, 5)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 48])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5])],
        [numpy_helper.from_array(weight, "w")],
    )
    tiny = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(tiny))
    out = tmp_path / "tiny_int4.onnx"
    code, text = _cli("quantize", str(tiny), "--int4", "--block-size", "16", "-o", str(out))
    assert code == 0, text
    assert "1 MatMul weight(s), block size 16" in text
    x = np.random.default_rng(1).standard_normal((4, 48)).astype(np.float32)
    import onnxruntime as ort

    [got] = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.abs(got - x @ weight).max() < 0.2 * np.abs(x @ weight).max()
    simple = next(s.path for s in builtin_sources() if s.name == "simple")
    code, text = _cli("quantize", str(simple), "--int4", "-o", str(tmp_path / "s4.onnx"))
    assert code == 2 and "no MatMul weight this INT4 mode can quantize" in text, text
    code, text = _cli("quantize", str(tiny), "--int4", "--dynamic", "-o", str(out))
    assert code == 2 and "--int4 quantizes weights only" in text
    code, text = _cli("quantize", str(tiny), "--int4", "--int8", "--dynamic", "-o", str(out))
    assert code == 2 and "exactly one of --int8 or --int4" in text
    code, text = _cli("quantize", str(tiny), "--int4", "--block-size", "24", "-o", str(out))
    assert code == 2 and "block size 24" in text


def _broken(int8: Path, target: Path) -> Path:
    """The quantized model with its INT8 weights scrambled (its hints kept), beside a
    copy of its float reference."""
    shutil.copyfile(int8.parent / FLOAT, target.parent / FLOAT)
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
    # The float model lives in the package: it is copied beside the quantized one.
    assert f"sordino.hints.float_reference = {FLOAT}" in out
    assert (int8.parent / FLOAT).read_bytes() == DIGITS.read_bytes()
    assert "sordino.hints.accuracy_bound = 0.99" in out and "guard_sample" in out
    code, out = _cli("quantize", str(DIGITS), "--int8", "-o", str(int8.parent / "x.onnx"))
    assert code == 2 and "exactly one of --calibration" in out


def test_guard_falls_back_to_float_on_a_broken_int8_model(int8: Path, tmp_path: Path) -> None:
    broken = _broken(int8, tmp_path / "broken_int8.onnx")
    config = load_config(None, {"quant_guard.enabled": True})
    sources = sources_for(ModelConfig(name="digits8", path=broken))
    with serve_in_thread(config, sources) as server:
        assert server.runtime.get("digits8").source.path == (tmp_path / FLOAT).resolve()
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


def _with_hint(int8: Path, target: Path, key: str, value: str) -> Path:
    """``int8`` copied to ``target`` with one runtime hint replaced by ``value``."""
    model = onnx.load(str(int8))
    for prop in model.metadata_props:
        if prop.key == f"sordino.hints.{key}":
            prop.value = value
    onnx.save(model, str(target))
    if (int8.parent / FLOAT).exists():
        shutil.copyfile(int8.parent / FLOAT, target.parent / FLOAT)
    return target


@pytest.mark.parametrize(
    "reference", ["/etc/passwd", "../outside/digits.onnx", "sub/../../digits.onnx"]
)
def test_a_float_reference_outside_the_model_folder_is_refused(
    int8: Path, tmp_path: Path, reference: str
) -> None:
    """The hint cannot make the server load a file from anywhere else."""
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.copyfile(DIGITS, outside / "digits.onnx")
    folder = tmp_path / "model"
    folder.mkdir()
    model = _with_hint(int8, folder / "digits_int8.onnx", "float_reference", reference)
    config = load_config(None, {"quant_guard.enabled": True})
    with pytest.raises(ModelLoadError, match="float_reference") as caught:
        sources = sources_for(ModelConfig(name="digits8", path=model))
        with serve_in_thread(config, sources):
            pass
    message = str(caught.value)
    assert "sordino.hints.float_reference" in message and "refused" in message, message


def test_a_symlink_out_of_the_model_folder_is_refused(int8: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    model = _with_hint(int8, folder / "digits_int8.onnx", "float_reference", "link.onnx")
    (folder / "link.onnx").symlink_to(DIGITS)
    config = load_config(None, {"quant_guard.enabled": True})
    sources = sources_for(ModelConfig(name="digits8", path=model))
    with (
        pytest.raises(ModelLoadError, match="leads out of the model's folder"),
        serve_in_thread(config, sources),
    ):
        pass


def test_an_oversized_guard_sample_is_refused_before_it_is_built(
    int8: Path, tmp_path: Path
) -> None:
    """A 0.3 MB hint that would expand to 256 MB of zeros: refused from its header."""
    huge = _npz_claiming(shape=(1_000_000, 64))
    assert len(huge) < 400_000
    model = _with_hint(int8, tmp_path / "digits_int8.onnx", "guard_sample", huge)
    config = load_config(None, {"quant_guard.enabled": True})
    sources = sources_for(ModelConfig(name="digits8", path=model))
    with pytest.raises(ModelLoadError) as caught, serve_in_thread(config, sources):
        pass
    message = str(caught.value)
    assert "digits8" in message and "sordino.hints.guard_sample" in message, message
    assert "rows" in message and len(message) < 400, message


def _npz_claiming(shape: tuple[int, ...]) -> str:
    """A base64 .npz whose one array of float32 zeros has ``shape`` (compressed: small)."""
    buffer = io.BytesIO()
    with (
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("pixels.npy", "w", force_zip64=True) as member,
    ):
        header = {"descr": "<f4", "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_1_0(member, header)
        chunk = bytes(1 << 20)
        left = int(np.prod(shape)) * 4
        while left > 0:
            member.write(chunk[: min(left, len(chunk))])
            left -= len(chunk)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def test_start_with_a_bad_guard_sample_says_which_model_and_hint(
    int8: Path, tmp_path: Path
) -> None:
    """Not a bare ``Aborted!``: one line naming the model and the hint."""
    model = _with_hint(int8, tmp_path / "digits_int8.onnx", "guard_sample", "bm90IGFuIG5weg==")
    cmd = [sys.executable, "-m", "sordino", "start", "--http-port", "0", "--grpc-port", "0",
           "--data-dir", str(tmp_path / "data"), "--model", f"digits8={model}",
           "--quant-aware", "true"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output
    assert "Aborted!" not in output and "Traceback" not in output, output
    assert "digits8" in output and "sordino.hints.guard_sample" in output, output


@pytest.mark.parametrize("precision", ["--int8", "--int4"])
def test_an_output_that_is_the_model_itself_is_refused(precision: str, tmp_path: Path) -> None:
    """``-o`` naming MODEL replaced the float model with its copy, which then named itself
    as the guard's float reference ("agreement 100%, max abs error 0", forever)."""
    model = tmp_path / "model.onnx"
    shutil.copyfile(DIGITS, model)
    extra = ["--dynamic"] if precision == "--int8" else []
    code, text = _cli("quantize", str(model), precision, *extra, "-o", str(tmp_path / "model.onnx"))
    assert code == 2, text
    assert "is the model itself" in text and "write the copy elsewhere" in text, text
    assert model.read_bytes() == DIGITS.read_bytes()
    code, text = _cli(
        "quantize", str(model), precision, *extra, "-o", str(tmp_path / "no" / "q.onnx")
    )
    assert code == 2, text
    assert "does not exist: create it" in text, text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]
