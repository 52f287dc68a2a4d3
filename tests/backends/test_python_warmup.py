"""``model_warmup`` in ``config.pbtxt``: the samples run on each instance before the
model serves, as on Triton (the fixture is also in the parity bench); a sample that
does not fit the model, or that the model fails on, stops the load saying why."""

from __future__ import annotations

import re
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from sordino.config import RuntimeConfig
from sordino.config.warmup import WarmupSample
from sordino.errors import ConfigError, ModelLoadError
from sordino.models.repository import builtin_sources, scan_repository
from sordino.testing import serve_in_thread

FIXTURE = Path(__file__).parent.parent / "fixtures" / "triton_python_answers" / "warmup"


def _repository(tmp_path: Path) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "warmup")
    return tmp_path / "warmup" / "config.pbtxt"


def _first_answer(tmp_path: Path) -> dict[str, list[float]]:
    with serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        x = httpclient.InferInput("X", [1, 4], "FP32")
        x.set_data_from_numpy(np.ones((1, 4), np.float32))
        result = client.infer("warmup", [x])
        client.close()
    return {name: result.as_numpy(name).ravel().tolist() for name in ("CALLS", "ROWS", "TOTAL")}


def test_the_samples_run_before_the_first_request(tmp_path: Path) -> None:
    """Before, sordino refused model_warmup at load ("does not support model_warmup")."""
    _repository(tmp_path)
    # zeros twice (1 row each), then 2 rows of [1, 2, 3, 4] read from warmup/x.bin.
    assert _first_answer(tmp_path) == {"CALLS": [3], "ROWS": [4], "TOTAL": [20.0]}


def test_each_instance_is_warmed_up(tmp_path: Path) -> None:
    config = _repository(tmp_path)
    config.write_text(config.read_text().replace("count: 1, kind", "count: 2, kind"))
    answer = _first_answer(tmp_path)
    # Whichever instance answers ran the three samples itself.
    assert answer == {"CALLS": [3], "ROWS": [4], "TOTAL": [20.0]}


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ('key: "X"', 'key: "Z"', "model_warmup 'zeros' lacks input X; give every input"),
        (
            "batch_size: 2",
            "batch_size: 8",
            "model_warmup 'from_file': batch_size 8; give 1 to the model's max_batch_size (4)",
        ),
        ('"x.bin"', '"y.bin"', "input_data_file 'y.bin' is not a file in"),
        (
            "data_type: TYPE_FP32 dims: [ 4 ] zero",
            "data_type: TYPE_INT32 dims: [ 4 ] zero",
            "data_type TYPE_INT32, but the model's input is FP32",
        ),
        ("dims: [ 4 ] zero", "dims: [ 5 ] zero", "dims [5] do not fit the model's [4]"),
        (
            "zero_data: true",
            "zero_data: true random_data: true",
            "give exactly one of zero_data: true, random_data: true or input_data_file",
        ),
    ],
)
def test_a_sample_that_does_not_fit_stops_the_load(
    tmp_path: Path, old: str, new: str, said: str
) -> None:
    config = _repository(tmp_path)
    text = config.read_text()
    assert old in text
    config.write_text(text.replace(old, new, 1))
    with (
        pytest.raises((ModelLoadError, ConfigError), match=re.escape(said)),
        serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)),
    ):
        pass


def test_a_data_file_outside_the_model_folder_is_refused(tmp_path: Path) -> None:
    """A symbolic link in warmup/ that leads out of the model folder is not read."""
    _repository(tmp_path)
    outside = tmp_path / "secret.bin"
    outside.write_bytes(b"\0" * 32)
    link = tmp_path / "warmup" / "warmup" / "x.bin"
    link.unlink()
    link.symlink_to(outside)
    with (
        pytest.raises(ModelLoadError, match=re.escape("input_data_file 'x.bin' is not a file in")),
        serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)),
    ):
        pass


def test_a_sample_the_model_fails_on_stops_the_load(tmp_path: Path) -> None:
    _repository(tmp_path)
    model = tmp_path / "warmup" / "1" / "model.py"
    model.write_text(
        model.read_text().replace(
            "        responses = []",
            "        raise ValueError('not warm yet')\n        responses = []",
        )
    )
    with (
        pytest.raises(ModelLoadError, match=r"model_warmup 'zeros' failed: .*not warm yet"),
        serve_in_thread(RuntimeConfig(), scan_repository(tmp_path)),
    ):
        pass


def test_an_onnx_models_config_takes_the_same_list() -> None:
    """The docs' example (configuration.md, model_warmup) on the built-in simple model:
    it loads; the same sample with a dimension the model does not take is refused."""
    simple = next(s for s in builtin_sources() if s.name == "simple")
    sample = {
        "name": "zeros",
        "batch_size": 4,
        "count": 2,
        "inputs": {
            "INPUT0": {"data_type": "TYPE_INT32", "dims": [16], "zero_data": True},
            "INPUT1": {"data_type": "TYPE_INT32", "dims": [16], "random_data": True},
        },
    }
    warmed = replace(simple, config=simple.config.model_copy(update={"model_warmup": (
        WarmupSample(**sample),)}))  # fmt: skip
    with serve_in_thread(RuntimeConfig(), [warmed]) as server:
        assert httpclient.InferenceServerClient(server.url.removeprefix("http://")).is_model_ready(
            "simple"
        )
    sample["inputs"]["INPUT1"]["dims"] = [15]  # type: ignore[index]
    wrong = replace(simple, config=simple.config.model_copy(update={"model_warmup": (
        WarmupSample(**sample),)}))  # fmt: skip
    with (
        pytest.raises(ModelLoadError, match=re.escape("dims [15] do not fit the model's [16]")),
        serve_in_thread(RuntimeConfig(), [wrong]),
    ):
        pass


def test_a_string_data_file_is_read_as_triton_lays_it_out(tmp_path: Path) -> None:
    """Each element a 4-byte little-endian length, then its bytes."""
    from sordino.inference import ModelMetadata, TensorSpec
    from sordino.server.warmup import warmup_requests

    (tmp_path / "warmup").mkdir()
    (tmp_path / "warmup" / "t.bin").write_bytes(b"\x02\x00\x00\x00hi\x00\x00\x00\x00")
    spec = TensorSpec("T", "BYTES", (-1, 2))
    metadata = ModelMetadata("m", "1", "python", (spec,), (), batched=True)
    sample = {"name": "s", "batch_size": 2, "inputs": {"T": {
        "data_type": "TYPE_STRING", "dims": [2], "input_data_file": "t.bin"}}}  # fmt: skip
    (request,) = warmup_requests(
        [WarmupSample(**sample)], metadata, max_batch_size=4, folder=tmp_path
    )
    assert request.inputs["T"].tolist() == [[b"hi", b""], [b"hi", b""]]
    (tmp_path / "warmup" / "t.bin").write_bytes(b"\x09\x00\x00\x00hi")
    with pytest.raises(
        ModelLoadError, match=re.escape("model m: model_warmup 's', input T: t.bin")
    ):
        warmup_requests([WarmupSample(**sample)], metadata, max_batch_size=4, folder=tmp_path)
