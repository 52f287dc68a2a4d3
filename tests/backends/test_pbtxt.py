"""Triton's config.pbtxt read into Triton's JSON form, and what sordino takes from it."""

from __future__ import annotations

import pytest

from sordino.backends.pbtxt import parse_pbtxt, sordino_settings
from sordino.errors import ConfigError

TEXT = """
# a comment
name: "w1"
backend: "python"
max_batch_size: 32
input [ { name: "x" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [
  { name: "y", data_type: TYPE_FP32, dims: [ -1, 4 ] }
]
dynamic_batching {
  preferred_batch_size: [ 8, 32 ]
  max_queue_delay_microseconds: 10000
}
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters: { key: "onnx_path" value: { string_value: "/tmp/a \\"b\\".onnx" } }
parameters { key: "threads" value { string_value: "2" } }
model_transaction_policy { decoupled: true }
"""


def test_the_text_format_becomes_tritons_json_form() -> None:
    """Repeated fields are lists, maps objects, enums their names, numbers numbers."""
    config = parse_pbtxt(TEXT)
    assert config["name"] == "w1" and config["max_batch_size"] == 32
    assert config["input"] == [{"name": "x", "data_type": "TYPE_FP32", "dims": [256]}]
    assert config["output"][0]["dims"] == [-1, 4]
    assert config["dynamic_batching"]["preferred_batch_size"] == [8, 32]
    assert config["parameters"] == {
        "onnx_path": {"string_value": '/tmp/a "b".onnx'},
        "threads": {"string_value": "2"},
    }
    assert config["model_transaction_policy"] == {"decoupled": True}


def test_sordino_takes_backend_batching_and_instances() -> None:
    """What ModelConfig gets: backend, max_batch_size, dynamic batching, instance group."""
    settings = sordino_settings(parse_pbtxt(TEXT), source="config.pbtxt")
    assert settings == {
        "backend": "python",
        "max_batch_size": 32,
        "dynamic_batching": {
            "preferred_batch_size": [8, 32],
            "max_queue_delay_microseconds": 10000,
        },
        "instance_count": 2,
        "instance_kind": "cpu",
    }


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ('name: "a"\ninput [ { name: "x" ', "line 2: missing '}'"),
        ('name: "a"\n}', "line 2: unexpected '}'"),
        ('name: "a"\n  @', "line 2: cannot read '@'"),
    ],
)
def test_a_broken_file_is_an_error_naming_the_line(text: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        parse_pbtxt(text, source="m/config.pbtxt")
