"""Runtime hints in the ONNX file: embedded, shown, applied at start, refused when bad."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.errors import ModelLoadError
from sordino.models.hints import read_hints
from sordino.models.repository import builtin_sources
from tests.cli.conftest import sordino_start

DIGITS = next(s.path for s in builtin_sources() if s.name == "digits-classifier")


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _embed(tmp_path: Path) -> Path:
    hinted = tmp_path / "digits_hinted.onnx"
    code, out = _cli(
        "hints", "embed", str(DIGITS), "--max-batch", "16", "--mode", "conservative",
        "--memory-pool", "96MB", "--precision", "fp32", "-o", str(hinted),
    )  # fmt: skip
    assert code == 0, out
    return hinted


def test_embed_then_show(tmp_path: Path) -> None:
    hinted = _embed(tmp_path)
    code, out = _cli("hints", "show", str(hinted))
    assert code == 0
    assert "sordino.hints.schema_version = 1" in out
    assert "sordino.hints.max_batch_size = 16" in out and "scheduler_mode = conservative" in out
    assert "memory_pool = 100663296" in out
    code, out = _cli("hints", "show", str(DIGITS))
    assert code == 0 and "no sordino runtime hints" in out
    code, out = _cli("hints", "embed", str(DIGITS), "--mode", "fastest", "-o", str(tmp_path / "x"))
    assert code == 2 and "scheduler_mode" in out and "Traceback" not in out


def test_start_applies_hints_and_explicit_config_wins(tmp_path: Path) -> None:
    hinted = _embed(tmp_path)
    config = tmp_path / "config.yaml"
    config.write_text(f"models:\n  - {{name: digits, path: {hinted}, scheduler_mode: manual}}\n")
    with sordino_start(["--config", str(config), "--log-level", "info"], tmp_path) as server:
        with urllib.request.urlopen(f"{server.url}/v2/models/digits/config", timeout=10) as r:
            triton = json.loads(r.read())
        assert triton["max_batch_size"] == 16
        with urllib.request.urlopen(f"{server.url}/v2/sordino/memory", timeout=10) as r:
            memory = json.loads(r.read())
        assert memory["config"]["pool_size"] == 96 * 2**20
    log = "\n".join(server.lines)
    assert "model digits: runtime hints applied: max_batch_size=16" in log
    assert "overridden by explicit config: scheduler_mode=conservative (config says manual)" in log
    assert "runtime hint memory_pool=100663296 bytes (digits_hinted.onnx) applied" in log


def test_bad_hints_stop_the_load_with_the_reason(tmp_path: Path) -> None:
    model = onnx.load(str(DIGITS))
    for key, value in (("sordino.hints.schema_version", "1"), ("sordino.hints.max_batch", "8")):
        prop = model.metadata_props.add()
        prop.key, prop.value = key, value
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    result = CliRunner().invoke(
        cli, ["start", "--model", str(bad), "--data-dir", str(tmp_path), "--http-port", "0"]
    )
    assert result.exit_code == 2, result.output
    assert "unknown runtime hint(s) sordino.hints.max_batch" in result.output
    assert "Traceback" not in result.output


def test_hints_are_written_without_the_onnx_package_and_read_back_by_it(tmp_path: Path) -> None:
    """The wire-format writer keeps the model intact: onnx and ONNX Runtime both read it."""
    import onnxruntime as ort

    hinted = _embed(tmp_path)
    again = tmp_path / "again.onnx"
    assert _cli("hints", "embed", str(hinted), "--max-batch", "8", "-o", str(again))[0] == 0
    model = onnx.load(str(again))
    onnx.checker.check_model(model)
    props = {p.key: p.value for p in model.metadata_props}
    assert props["sordino.hints.max_batch_size"] == "8"
    assert "sordino.hints.scheduler_mode" not in props  # the earlier hints are replaced
    session = ort.InferenceSession(str(again), providers=["CPUExecutionProvider"])
    assert session.get_modelmeta().custom_metadata_map["sordino.hints.schema_version"] == "1"


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("max_batch_size", "1000000000000", "less than or equal to 65536"),
        ("max_batch_size", "true", "valid integer"),
        ("memory_pool", "4KB", "greater than or equal to 65536"),
    ],
    ids=["huge_batch", "bool_batch", "tiny_pool"],
)
def test_hints_out_of_range_are_refused(tmp_path: Path, key: str, value: str, needle: str) -> None:
    """A hint is held to the same ranges as the configuration it fills in."""
    model = onnx.load(str(DIGITS))
    for name, text in (("schema_version", "1"), (key, value)):
        prop = model.metadata_props.add()
        prop.key, prop.value = f"sordino.hints.{name}", text
    path = tmp_path / "hinted.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelLoadError, match=needle) as caught:
        read_hints(path)
    assert f"sordino.hints.{key}" in str(caught.value)


def test_embed_refuses_an_out_of_range_hint(tmp_path: Path) -> None:
    code, out = _cli("hints", "embed", str(DIGITS), "--max-batch", str(10**12),
                     "-o", str(tmp_path / "x.onnx"))  # fmt: skip
    assert code == 2 and "max_batch_size" in out and "65536" in out, out
    code, out = _cli("hints", "embed", str(DIGITS), "--float-reference", "/etc/passwd",
                     "-o", str(tmp_path / "x.onnx"))  # fmt: skip
    assert code == 2 and "float_reference" in out and "absolute" in out, out
