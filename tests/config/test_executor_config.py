"""The ``executor`` section and a model's ``ray`` options: accepted shapes and clear refusals."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from sordino.config import RuntimeConfig

MODEL = {"name": "m", "path": "m.onnx"}


def test_defaults_run_worker_processes() -> None:
    config = RuntimeConfig()
    assert config.executor.kind == "process" and config.executor.address is None


def test_the_issue_shape_loads() -> None:
    config = RuntimeConfig.model_validate(
        {
            "executor": {"kind": "ray", "address": "auto", "namespace": "sordino"},
            "models": [
                {
                    **MODEL,
                    "instance_count": 6,
                    "ray": {"num_cpus": 1, "num_gpus": 0, "resources": {}, "placement": "spread"},
                }
            ],
        }
    )
    options = config.models[0].ray
    assert options is not None and options.placement == "spread" and options.num_cpus == 1


@pytest.mark.parametrize(
    ("data", "words"),
    [
        ({"executor": {"kind": "dask"}}, "'process' or 'ray'"),
        ({"executor": {"address": "auto"}}, "set kind: ray"),
        ({"executor": {"kind": "ray", "address": " "}}, "address is empty"),
        ({"models": [{**MODEL, "ray": {"num_cpus": 1}}]}, "executor.kind: ray"),
        (
            {"executor": {"kind": "ray"}, "models": [{**MODEL, "isolation": "thread"}]},
            "isolation: thread",
        ),
        (
            {"executor": {"kind": "ray"}, "models": [{**MODEL, "ray": {"num_cpus": -1}}]},
            "greater than or equal to 0",
        ),
        (
            {"executor": {"kind": "ray"}, "models": [{**MODEL, "ray": {"resources": {"GPU": 1}}}]},
            "use num_cpus / num_gpus",
        ),
        (
            {"executor": {"kind": "ray"}, "models": [{**MODEL, "ray": {"placement": "random"}}]},
            "'default', 'spread' or 'pack'",
        ),
        (
            {"executor": {"kind": "ray"}, "models": [{**MODEL, "ray": {"cpus": 1}}]},
            "Extra inputs are not permitted",
        ),
    ],
)
def test_bad_values_say_what_to_fix(data: dict[str, object], words: str) -> None:
    with pytest.raises(ValidationError, match=words.replace("(", r"\(")):
        RuntimeConfig.model_validate(data)
