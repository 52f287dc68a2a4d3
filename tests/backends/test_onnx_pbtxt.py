"""An ONNX model's ``config.pbtxt`` is read as Triton reads it: its batching and instance
settings are served, its declared tensors checked against the model, and what sordino
does not do is refused by name (it was not read at all before)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from sordino.backends.onnx_pbtxt import check_declared
from sordino.config import RuntimeConfig
from sordino.config.models import ModelConfig
from sordino.errors import ConfigError, ModelLoadError
from sordino.inference import ModelMetadata, TensorSpec
from sordino.models.repository import builtin_sources, scan_repository
from sordino.testing import serve_in_thread

SIMPLE = """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
optimization { input_pinned_memory { enable: true } }
"""


def _repository(root: Path, text: str = SIMPLE) -> Path:
    simple = next(s for s in builtin_sources() if s.name == "simple")
    (root / "simple" / "1").mkdir(parents=True)
    shutil.copyfile(simple.path, root / "simple" / "1" / "model.onnx")
    (root / "simple" / "config.pbtxt").write_text(text)
    return root


def _tensors(rows: int) -> list[httpclient.InferInput]:
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [rows, 16], "INT32")
        tensor.set_data_from_numpy(np.arange(rows * 16, dtype=np.int32).reshape(rows, 16))
        inputs.append(tensor)
    return inputs


def test_a_triton_onnx_repository_is_served_with_its_settings(tmp_path: Path) -> None:
    """Before, its max_batch_size, batcher and instance count were ignored."""
    root = _repository(tmp_path)
    (source,) = scan_repository(root)
    assert (source.config.max_batch_size, source.config.instance_count) == (8, 2)
    assert source.config.intra_op_threads == 1
    assert source.config.dynamic_batching.max_queue_delay_microseconds == 100
    with serve_in_thread(RuntimeConfig(), [source]) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        result = client.infer("simple", _tensors(3))
        x = np.arange(3 * 16, dtype=np.int32).reshape(3, 16)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * x)
        with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
            client.infer("simple", _tensors(9))
        config = client.get_model_config("simple")
        assert config["max_batch_size"] == 8
        assert config["instance_group"][0]["count"] == 2
        client.close()


def test_without_a_batcher_the_onnx_backends_default_one_is_added(tmp_path: Path) -> None:
    """As Triton's ONNX Runtime backend completes it: a batching model gets a dynamic
    batcher that waits for nothing; with max_batch_size 1 or 0 there is none."""
    text = SIMPLE.replace("dynamic_batching { max_queue_delay_microseconds: 100 }", "")
    (source,) = scan_repository(_repository(tmp_path / "a", text))
    batching = source.config.dynamic_batching
    assert (batching.enabled, batching.max_queue_delay_microseconds) == (None, 0)
    (source,) = scan_repository(_repository(tmp_path / "b", text.replace(": 8", ": 1", 1)))
    assert source.config.dynamic_batching.enabled is False


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        ('name: "OUTPUT1"', 'name: "OUTPUT9"', "output 'OUTPUT9' is not one of the model's"),
        ("TYPE_INT32 dims: [ 16 ] },\n  { name: \"INPUT1\"", "TYPE_FP32 dims: [ 16 ] },\n  "
         "{ name: \"INPUT1\"", "input INPUT0 is TYPE_FP32, but the model's is INT32"),
        ('"OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ]', '"OUTPUT0" data_type: TYPE_INT32 dims: '
         "[ 4, 4 ]", "output OUTPUT0 has dims [4, 4], but the model's are [16] (after the batch"),
    ],
)  # fmt: skip
def test_declared_tensors_the_model_lacks_stop_the_load(
    tmp_path: Path, old: str, new: str, said: str
) -> None:
    assert old in SIMPLE
    root = _repository(tmp_path, SIMPLE.replace(old, new, 1))
    with (
        pytest.raises(ModelLoadError, match=re.escape(said)),
        serve_in_thread(RuntimeConfig(), scan_repository(root)),
    ):
        pass


def test_a_batch_size_for_a_model_that_cannot_batch_is_refused() -> None:
    metadata = ModelMetadata(
        "fixed", "1", "onnxruntime_onnx", (TensorSpec("X", "FP32", (2, 4)),), (), batched=False
    )
    config = ModelConfig(max_batch_size=4, input=({"name": "X", "data_type": "TYPE_FP32",
                                                    "dims": [4]},))  # fmt: skip
    with pytest.raises(ModelLoadError, match="max_batch_size 4, but the model's first dimension"):
        check_declared(config, metadata)
    full = config.model_copy(update={"max_batch_size": 0})
    with pytest.raises(ModelLoadError, match=re.escape("has dims [4], but the model's are [2, 4]")):
        check_declared(full, metadata)


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        ('parameters { key: "not_a_parameter" value: { string_value: "1" } }',
         "parameters.not_a_parameter"),
        ('optimization { execution_accelerators { cpu_execution_accelerator : [ { name : '
         '"openvino" } ] } }', "optimization.execution_accelerators"),
        ("model_transaction_policy { decoupled: true }", "model_transaction_policy.decoupled"),
    ],
)  # fmt: skip
def test_what_sordino_does_not_do_is_refused_by_name(tmp_path: Path, extra: str, said: str) -> None:
    root = _repository(tmp_path, SIMPLE + extra + "\n")
    with pytest.raises(ConfigError, match=re.escape(said)) as raised:
        scan_repository(root)
    # Said for an ONNX model, or for every backend.
    told = r"(for an ONNX model|sordino does not support \S+); remove it"
    assert re.search(told, str(raised.value))


def test_default_model_filename_names_the_file_each_version_serves(tmp_path: Path) -> None:
    """As Triton: a folder may hold other files of the kind; the one named serves (it
    was refused before). A name with no such file stops the load, saying so."""
    root = _repository(tmp_path / "a", SIMPLE + 'default_model_filename: "simple.onnx"\n')
    version = root / "simple" / "1"
    (version / "model.onnx").rename(version / "simple.onnx")
    shutil.copy(version / "simple.onnx", version / "spare.onnx")
    (source,) = scan_repository(root)
    assert source.path == version / "simple.onnx"
    with serve_in_thread(RuntimeConfig(), [source]) as server:
        client = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        assert client.infer("simple", _tensors(1)).as_numpy("OUTPUT0").shape == (1, 16)
        client.close()
    missing = _repository(tmp_path / "b", SIMPLE + 'default_model_filename: "nope.onnx"\n')
    with pytest.raises(
        ModelLoadError, match=r"no nope.onnx in .* \(the file its default_model_filename names\)"
    ):
        scan_repository(missing)
    with pytest.raises(ConfigError, match="default_model_filename"):
        scan_repository(_repository(tmp_path / "c", SIMPLE + 'default_model_filename: "../x"\n'))


def test_a_reshape_and_a_label_file_are_taken(tmp_path: Path) -> None:
    """(A reshape was refused before; tests/backends/test_reshape.py serves them.)"""
    at = 'dims: [ 16 ] },\n  { name: "INPUT1"'
    reshaped = SIMPLE.replace(at, at.replace("] }", "] reshape: { shape: [ 4, 4 ] } }"))
    (source,) = scan_repository(_repository(tmp_path / "a", reshaped))
    assert source.config.input[0].reshape == (4, 4)
    at = '"OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ]'
    labelled = SIMPLE.replace(at, at + ' label_filename: "l.txt"')
    (source,) = scan_repository(_repository(tmp_path / "b", labelled))
    assert source.config.label_filename == {"OUTPUT1": Path("l.txt")}
