"""Runtime hints in the ONNX file: embedded, shown, applied at start, refused when bad."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path
from typing import Any

import onnx
import pytest
from click.testing import CliRunner

from sordino.cli.main import cli
from sordino.config import ModelConfig, RuntimeConfig
from sordino.errors import ModelLoadError
from sordino.models.hints import apply_hints, read_hints, with_runtime_hints
from sordino.models.repository import builtin_sources
from tests.cli.conftest import sordino_start

DIGITS = next(s.path for s in builtin_sources() if s.name == "digits-classifier")
DIFFUSION = next(s.path for s in builtin_sources() if s.name == "digits-diffusion")


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def _get(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def _generate(url: str, model: str) -> dict[str, Any]:
    body = {
        "inputs": [
            {"name": "prompt", "datatype": "BYTES", "shape": [1], "data": ["a handwritten 7"]},
            {"name": "seed", "datatype": "INT64", "shape": [1], "data": [3]},
            {"name": "steps", "datatype": "INT32", "shape": [1], "data": [20]},
        ],
        "outputs": [{"name": "image"}],
    }
    request = urllib.request.Request(
        f"{url}/v2/models/{model}/infer",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())  # type: ignore[no-any-return]


def _metric(url: str, family: str, model: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as response:
        text = response.read().decode()
    for metric in text_string_to_metric_families(text):
        if metric.name == family:
            return sum(s.value for s in metric.samples if s.labels.get("model") == model)
    return 0.0


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
    denoiser = tmp_path / "sd3_opt.onnx"  # step_cache and memory_strategy hints, both overridden
    assert _cli("hints", "embed", str(DIFFUSION), "-o", str(denoiser))[0] == 0
    config = tmp_path / "config.yaml"
    config.write_text(
        "memory: {strategy: simple}\n"
        f"models:\n  - {{name: digits, path: {hinted}, scheduler_mode: manual}}\n"
        f"  - name: gen\n    path: {denoiser}\n"
        "    iterative: {guidance: 3.0, step_cache: {enabled: false}}\n"
    )
    with sordino_start(["--config", str(config), "--log-level", "info"], tmp_path) as server:
        with urllib.request.urlopen(f"{server.url}/v2/models/digits/config", timeout=10) as r:
            triton = json.loads(r.read())
        assert triton["max_batch_size"] == 16
        with urllib.request.urlopen(f"{server.url}/v2/sordino/memory", timeout=10) as r:
            memory = json.loads(r.read())
        assert memory["config"]["pool_size"] == 96 * 2**20
        assert memory["config"]["strategy"] == "simple"
        gen = _get(f"{server.url}/v2/models/gen/config")
        assert gen["parameters"]["sordino_step_cache"]["string_value"] == "off"
        assert _generate(server.url, "gen")["parameters"]["cached_steps"] == 0
    log = "\n".join(server.lines)
    assert "model digits: runtime hints applied: max_batch_size=16" in log
    assert "overridden by explicit config: scheduler_mode=conservative (config says manual)" in log
    assert "runtime hint memory_pool=100663296 bytes (digits_hinted.onnx) applied" in log
    assert "overridden by explicit config: iterative (config makes the model iterative), " in log
    assert "step_cache=0.1 (config says iterative.step_cache)" in log
    assert "memory_strategy=fragmentation_aware (sd3_opt.onnx) overridden by memory.strategy" in log


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


def test_embed_with_no_hint_named_picks_step_caching_and_placement(tmp_path: Path) -> None:
    """ATC's --embed-runtime-hints true: a denoiser gets generator serving, step caching
    and fragmentation-aware placement; a classifier gets the placement only."""
    hinted = tmp_path / "diffusion_hinted.onnx"
    code, out = _cli("hints", "embed", str(DIFFUSION), "-o", str(hinted))
    assert code == 0, out
    found = read_hints(hinted)
    assert found is not None and found.memory_strategy == "fragmentation_aware"
    assert found.iterative is not None and found.iterative.sample_shape == (64,)
    assert found.step_cache == 0.1
    assert 'sordino.hints.iterative = {"sample_shape":[64]}' in out
    plain = tmp_path / "classifier_hinted.onnx"
    code, out = _cli("hints", "embed", str(DIGITS), "--embed-runtime-hints", "true",
                     "-o", str(plain))  # fmt: skip
    assert code == 0, out
    found = read_hints(plain)
    assert found is not None and found.iterative is None and found.step_cache is None
    assert found.memory_strategy == "fragmentation_aware"
    code, out = _cli("hints", "embed", str(DIGITS), "--embed-runtime-hints", "false",
                     "-o", str(plain))  # fmt: skip
    assert code == 2 and "nothing to embed" in out, out


def test_a_hinted_denoiser_starts_with_step_caching_and_the_placement(tmp_path: Path) -> None:
    hinted = tmp_path / "sd3_opt.onnx"
    guidance = '{"guidance": 3.0}'
    code, out = _cli("hints", "embed", str(DIFFUSION), "--auto", "--iterative", guidance,
                     "-o", str(hinted))  # fmt: skip
    assert code == 0, out
    found = read_hints(hinted)  # the file's sample shape beside the named guidance
    assert found is not None and found.iterative is not None
    assert (found.iterative.sample_shape, found.iterative.guidance) == ((64,), 3.0)
    args = ["--model", str(hinted), "--model", f"plain={DIFFUSION}"]
    with sordino_start(args, tmp_path) as server:
        triton = _get(f"{server.url}/v2/models/sd3_opt/config")
        assert triton["platform"] == "sordino_iterative"
        cache = triton["parameters"]["sordino_step_cache"]["string_value"]
        assert cache == "threshold=0.1,max_skips=2"
        assert (
            "sordino_step_cache" not in _get(f"{server.url}/v2/models/plain/config")["parameters"]
        )
        memory = _get(f"{server.url}/v2/sordino/memory")
        assert memory["config"]["strategy"] == "fragmentation_aware"
        answer = _generate(server.url, "sd3_opt")["parameters"]
        assert answer["steps_used"] == 20 and 0 < answer["cached_steps"] < 20
        skipped = _metric(server.url, "sordino_generation_step_cache_skipped", "sd3_opt")
        computed = _metric(server.url, "sordino_generation_step_cache_computed", "sd3_opt")
        assert (skipped, computed) == (answer["cached_steps"], 20 - answer["cached_steps"])
    log = "\n".join(server.lines)
    assert "model sd3_opt: runtime hints applied: iterative, step_cache=0.1" in log
    assert "runtime hint memory_strategy=fragmentation_aware (sd3_opt.onnx) applied" in log


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [
        ("step_cache", "1.5", "less than or equal to 1"),
        ("memory_strategy", "tetris", "fragmentation_aware"),
        ("iterative", "[1, 2]", "JSON object"),
        ("iterative", '{"sample_shape": [100000, 100000]}', "holds more than"),
        ("iterative", '{"step": 3}', "step"),
    ],
    ids=["big_threshold", "unknown_strategy", "not_an_object", "huge_sample", "unknown_key"],
)
def test_new_hints_out_of_range_are_refused(
    tmp_path: Path, key: str, value: str, needle: str
) -> None:
    model = onnx.load(str(DIFFUSION))
    for name, text in (("schema_version", "1"), (key, value)):
        prop = model.metadata_props.add()
        prop.key, prop.value = f"sordino.hints.{name}", text
    path = tmp_path / "hinted.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelLoadError, match=needle) as caught:
        read_hints(path)
    assert f"sordino.hints.{key}" in str(caught.value)
    code, out = _cli("hints", "embed", str(DIFFUSION), f"--{key.replace('_', '-')}", value,
                     "-o", str(tmp_path / "x.onnx"))  # fmt: skip
    assert code == 2 and key in out and "Traceback" not in out, out


def test_a_step_cache_hint_needs_a_generator_and_placement_yields_to_config(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hinted = tmp_path / "classifier.onnx"
    code, out = _cli("hints", "embed", str(DIGITS), "--step-cache", "0.2",
                     "--memory-strategy", "simple", "-o", str(hinted))  # fmt: skip
    assert code == 0, out
    applied = apply_hints(ModelConfig(name="digits", path=hinted), hinted)
    assert applied is not None and applied.config.iterative is None
    assert applied.overridden == (
        "step_cache=0.2 (the model is not served as a generator: no iterative)",
    )
    caplog.set_level(logging.INFO, logger="sordino.hints")
    assert with_runtime_hints(RuntimeConfig(), [hinted]).memory.strategy == "simple"
    assert with_runtime_hints(RuntimeConfig(), [DIGITS]).memory.strategy == "best_fit"
    off = RuntimeConfig.model_validate({"memory": {"enabled": False}})
    assert with_runtime_hints(off, [hinted]).memory.strategy == "best_fit"
    assert "memory_strategy=simple (classifier.onnx) not applied: the memory manager is off" in (
        caplog.text
    )
    given = RuntimeConfig.model_validate({"memory": {"strategy": "best_fit"}})
    assert with_runtime_hints(given, [hinted]).memory.strategy == "best_fit"
    assert "overridden by memory.strategy=best_fit" in caplog.text
