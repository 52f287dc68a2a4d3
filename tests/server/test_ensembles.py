"""Triton ensembles read from a repository: wiring by tensor names, steps that do not
batch, and every mistake refused at start-up with what to fix."""

from __future__ import annotations

import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from sordino.config import RuntimeConfig, load_config
from sordino.config.pipelines import nodes_first
from sordino.control.client import request_json
from sordino.errors import ConfigError, ModelLoadError
from sordino.models.ensembles import ensemble_pipeline, with_ensembles
from sordino.models.repository import builtin_sources, scan_repository
from sordino.testing import serve_in_thread

FIXTURES = Path(__file__).parent.parent / "fixtures"

CENTRED = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            # Not row by row: two requests merged into one would change every answer.
            y = (x - x.sum(axis=0, keepdims=True)).astype(np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", y)]))
        return responses
"""

CENTRED_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "X", data_type: TYPE_INT32, dims: [ -1, 16 ] } ]
output [ { name: "Y", data_type: TYPE_INT32, dims: [ -1, 16 ] } ]
"""

CHAIN = """
name: "chain"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "P", data_type: TYPE_INT32, dims: [ 16 ] },
  { name: "Q", data_type: TYPE_INT32, dims: [ 16 ] }
]
output [ { name: "R", data_type: TYPE_INT32, dims: [ 16 ] } ]
ensemble_scheduling {
  step [
    { model_name: "centred" input_map { key: "X" value: "s" } output_map { key: "Y" value: "R" } },
    {
      model_name: "simple"
      input_map { key: "INPUT0" value: "P" }
      input_map { key: "INPUT1" value: "Q" }
      output_map { key: "OUTPUT0" value: "s" }
    }
  ]
}
"""


def _ensemble(root: Path, name: str, text: str) -> Path:
    folder = root / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(text)
    return folder


def _repository(root: Path) -> Path:
    folder = root / "centred"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(CENTRED)
    (folder / "config.pbtxt").write_text(CENTRED_CONFIG)
    _ensemble(root, "chain", CHAIN)
    return root


def _config(root: Path, **server: object) -> RuntimeConfig:
    config = load_config(None, {"model_repository": str(root), "server": server})
    return config.model_copy(
        update={"pipelines": with_ensembles(config.pipelines, config.model_repository)}
    )


def _ask(url: str, model: str, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    body = {
        "inputs": [
            {"name": n, "shape": list(a.shape), "datatype": "INT32", "data": a.ravel().tolist()}
            for n, a in (("P", p), ("Q", q))
        ]
    }
    answer = request_json("POST", f"{url}/v2/models/{model}/infer", body, timeout=30)
    (out,) = answer["outputs"]
    assert out["name"] == "R"
    return np.array(out["data"], np.int32).reshape(out["shape"])


def test_a_step_that_does_not_batch_takes_each_request_whole(tmp_path: Path) -> None:
    """A batching ensemble may hold a model that does not batch (Triton: its dims carry
    the batch dimension); each request reaches it alone, however many arrive at once."""
    root = _repository(tmp_path / "models")
    sources = scan_repository(root) + [s for s in builtin_sources() if s.name == "simple"]
    assert {s.name for s in sources} == {"centred", "simple"}  # the ensemble is not a model
    rng = np.random.default_rng(11)
    asked = [
        (rng.integers(-50, 50, (n, 16), np.int32), rng.integers(-50, 50, (n, 16), np.int32))
        for n in (1, 2, 3, 1, 4, 2, 3, 1)
    ]
    with serve_in_thread(_config(root), sources) as server:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda pq: _ask(server.url, "chain", *pq), asked))
        metadata = request_json("GET", f"{server.url}/v2/models/chain", timeout=10)
    for (p, q), answer in zip(asked, answers, strict=True):
        s = p + q
        np.testing.assert_array_equal(answer, s - s.sum(axis=0, keepdims=True))
    assert metadata["platform"] == "ensemble"
    assert [(t["name"], t["shape"]) for t in metadata["inputs"]] == [
        ("P", [-1, 16]),
        ("Q", [-1, 16]),
    ]


def test_an_ensemble_batching_more_than_a_step_is_refused(tmp_path: Path) -> None:
    """As Triton: a step that batches must take the ensemble's max_batch_size."""
    root = _repository(tmp_path / "models")
    (root / "chain" / "config.pbtxt").write_text(
        CHAIN.replace("max_batch_size: 8", "max_batch_size: 100")
    )
    sources = scan_repository(root) + [s for s in builtin_sources() if s.name == "simple"]
    with (
        pytest.raises(
            ModelLoadError,
            match="pipeline chain allows a batch of 100, but node "
            "simple's model simple allows only 64: lower",
        ),
        serve_in_thread(_config(root), sources),
    ):
        pass


STEP = (
    '{ model_name: "simple" input_map { key: "INPUT0" value: "P" } '
    'input_map { key: "INPUT1" value: "Q" } output_map { key: "OUTPUT0" value: "R" } }'
)


def _text(*, steps: str = STEP, extra: str = "", output: str = "R", inputs: str = "P") -> str:
    return (
        f'name: "bad"\nplatform: "ensemble"\nmax_batch_size: 8\n{extra}\n'
        f'input [ {{ name: "{inputs}", data_type: TYPE_INT32, dims: [ 16 ] }}, '
        '{ name: "Q", data_type: TYPE_INT32, dims: [ 16 ] } ]\n'
        f'output [ {{ name: "{output}", data_type: TYPE_INT32, dims: [ 16 ] }} ]\n'
        f"ensemble_scheduling {{ step [ {steps} ] }}\n"
    )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (_text(output="Z"), "ensemble output 'Z' is produced by no step"),
        (
            _text(inputs="O"),
            "input INPUT0 reads 'P', which is neither an input of the "
            "ensemble nor produced by a step",
        ),
        (_text(steps=f"{STEP}, {STEP}"), "ensemble tensor 'R' is produced by two steps"),
        (
            _text(steps=STEP.replace("model_name", "model_version: 2 model_name")),
            "model_version 2 is not supported",
        ),
        (
            _text(extra="dynamic_batching { }"),
            "dynamic_batching is not supported on an ensemble by sordino; remove it",
        ),
        (_text().replace('name: "bad"', 'name: "other"'), "name 'other' differs from its folder"),
        (
            _text().replace(STEP, STEP.replace('"Q"', '"P"')) + "",
            "ensemble input 'Q' is read by no step; remove it",
        ),
    ],
)
def test_a_mistaken_ensemble_is_refused_saying_what_to_fix(
    tmp_path: Path, text: str, said: str
) -> None:
    folder = _ensemble(tmp_path, "bad", text)
    with pytest.raises(ConfigError, match=said) as raised:
        ensemble_pipeline(folder)
    assert str(folder / "config.pbtxt") in str(raised.value)


def test_fields_at_tritons_defaults_are_taken(tmp_path: Path) -> None:
    """A configuration copied from Triton's GET …/config carries them."""
    extra = 'backend: ""\nversion_policy: { latest: { num_versions: 1 } }'
    folder = _ensemble(tmp_path, "bad", _text(extra=extra))
    assert ensemble_pipeline(folder).name == "bad"
    other = _ensemble(tmp_path / "b", "bad", _text(extra="version_policy: { all { } }"))
    with pytest.raises(ConfigError, match="version_policy is not supported on an ensemble"):
        ensemble_pipeline(other)


def test_an_ensemble_without_a_version_folder_is_refused(tmp_path: Path) -> None:
    folder = _ensemble(tmp_path, "bad", _text())
    (folder / "1").rmdir()
    with pytest.raises(ConfigError, match="an ensemble needs a version folder, as in Triton"):
        ensemble_pipeline(folder)


def test_the_examples_ensembles_are_read_in_name_order() -> None:
    root = FIXTURES / "triton_python_answers"
    names = [p.name for p in with_ensembles((), root)]
    assert names == ["ensemble_add_sub", "ensemble_batched"]
    chained = ensemble_pipeline(root / "ensemble_add_sub")
    # The steps, listed last first, run first first.
    assert [n.name for n in chained.order()] == ["add_sub_2", "add_sub"]
    assert chained.outputs == {"TWICE_A": "add_sub.OUTPUT0", "diff": "add_sub_2.OUTPUT1"}


INNER = """
name: "z_inner"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "P", data_type: TYPE_INT32, dims: [ 16 ] },
  { name: "Q", data_type: TYPE_INT32, dims: [ 16 ] }
]
output [ { name: "R", data_type: TYPE_INT32, dims: [ 16 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "simple"
      input_map { key: "INPUT0" value: "P" }
      input_map { key: "INPUT1" value: "Q" }
      output_map { key: "OUTPUT0" value: "R" }
    }
  ]
}
"""

OUTER = """
name: "a_outer"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "P", data_type: TYPE_INT32, dims: [ 16 ] },
  { name: "Q", data_type: TYPE_INT32, dims: [ 16 ] }
]
output [ { name: "R", data_type: TYPE_INT32, dims: [ 16 ] } ]
ensemble_scheduling {
  step [
    { model_name: "centred" input_map { key: "X" value: "P" } output_map { key: "Y" value: "c" } },
    {
      model_name: "z_inner"
      input_map { key: "P" value: "c" }
      input_map { key: "Q" value: "Q" }
      output_map { key: "R" value: "R" }
    }
  ]
}
"""


def test_an_ensemble_of_ensembles_is_built_inner_first_and_drained_outer_first(
    tmp_path: Path,
) -> None:
    """The outer one sorts first by name, and its second step reaches the inner one
    only after the server began to stop: that request still gets its answer."""
    root = _repository(tmp_path / "models")
    slow = CENTRED.replace("import numpy as np", "import time\nimport numpy as np").replace(
        "        responses = []", "        time.sleep(0.8)\n        responses = []"
    )
    (root / "centred" / "1" / "model.py").write_text(slow)
    _ensemble(root, "z_inner", INNER)
    _ensemble(root, "a_outer", OUTER)
    sources = scan_repository(root) + [s for s in builtin_sources() if s.name == "simple"]
    rng = np.random.default_rng(12)
    asked = [
        (rng.integers(-50, 50, (n, 16), np.int32), rng.integers(-50, 50, (n, 16), np.int32))
        for n in (1, 2, 3)
    ]
    with ThreadPoolExecutor(3) as pool:
        with serve_in_thread(_config(root), sources) as server:
            url = server.url
            request_json("GET", f"{url}/v2/models/a_outer/ready", timeout=10)
            answers = [pool.submit(_ask, url, "a_outer", p, q) for p, q in asked]
            time.sleep(0.3)  # the requests are in the slow first step when the server stops
        for (p, q), answer in zip(asked, answers, strict=True):
            c = p - p.sum(axis=0, keepdims=True)
            np.testing.assert_array_equal(answer.result(timeout=30), c + q)


def test_pipelines_that_run_each_other_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "models"
    _ensemble(root, "z_inner", INNER.replace('"simple"', '"a_outer"'))
    _ensemble(root, "a_outer", OUTER)
    with pytest.raises(ConfigError, match="pipelines run each other in a cycle: a_outer, z_inner"):
        nodes_first(with_ensembles((), root))


def test_a_decoupled_step_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "models"
    shutil.copytree(FIXTURES / "triton_python_examples" / "repeat_int32", root / "repeat_int32")
    step = (
        '{ model_name: "repeat_int32" input_map { key: "IN" value: "I" } '
        'input_map { key: "DELAY" value: "D" } input_map { key: "WAIT" value: "W" } '
        'output_map { key: "OUT" value: "O" } output_map { key: "IDX" value: "X" } }'
    )
    tensors = ", ".join(f'{{ name: "{n}", data_type: TYPE_INT32, dims: [ 1 ] }}' for n in "IDW")
    text = (
        f'platform: "ensemble"\nmax_batch_size: 0\ninput [ {tensors} ]\n'
        f"ensemble_scheduling {{ step [ {step} ] }}\n"
    )
    _ensemble(root, "streamed", text)
    with (
        pytest.raises(
            ModelLoadError,
            match="model repeat_int32 is iterative, streaming or "
            "decoupled; pipeline nodes must be one-shot models",
        ),
        serve_in_thread(_config(root), scan_repository(root)),
    ):
        pass


def test_an_optional_input_a_step_leaves_unmapped_stays_optional(tmp_path: Path) -> None:
    """As in Triton, a step's optional input may be left out of its input_map; the
    pipeline then takes it as an optional input of its own name."""
    root = tmp_path / "models"
    shutil.copytree(FIXTURES / "triton_python_answers" / "optional_input", root / "optional_input")
    step = (
        '{ model_name: "optional_input" input_map { key: "X" value: "IN" } '
        'output_map { key: "Y" value: "OUT" } }'
    )
    text = (
        'platform: "ensemble"\nmax_batch_size: 4\n'
        'input [ { name: "IN", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
        'output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
        f"ensemble_scheduling {{ step [ {step} ] }}\n"
    )
    _ensemble(root, "biased", text)
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    with serve_in_thread(_config(root), scan_repository(root)) as server:
        body = {"inputs": [{"name": "IN", "shape": [2, 4], "datatype": "FP32",
                            "data": x.ravel().tolist()}]}  # fmt: skip
        answer = request_json("POST", f"{server.url}/v2/models/biased/infer", body, timeout=30)
        assert answer["outputs"][0]["data"] == (x + 100).ravel().tolist()
        bias = {"name": "BIAS", "shape": [2, 4], "datatype": "FP32", "data": [1.0] * 8}
        body["inputs"].append(bias)
        answer = request_json("POST", f"{server.url}/v2/models/biased/infer", body, timeout=30)
        assert answer["outputs"][0]["data"] == (x + 1).ravel().tolist()


def test_a_step_is_asked_for_its_mapped_outputs_and_what_it_leaves_out_is_left_out(
    tmp_path: Path,
) -> None:
    """As Triton's ensemble does: the step's requested_output_names() are its
    output_map's keys (A and C, not B); C, which the model never returns, is left out
    of the answer, even when asked for; a later step that needs it fails, naming it."""
    root = tmp_path / "models"
    answers = FIXTURES / "triton_python_answers"
    shutil.copytree(answers / "requested_only", root / "requested_only")
    shutil.copytree(answers / "optional_input", root / "optional_input")
    first = (
        '{ model_name: "requested_only" input_map { key: "X" value: "IN" } '
        'output_map { key: "A" value: "OA" } output_map { key: "C" value: "OC" } }'
    )
    text = (
        'platform: "ensemble"\nmax_batch_size: 4\n'
        'input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
        'output [ { name: "OA", data_type: TYPE_INT32, dims: [ 1 ] },\n'
        '         { name: "OC", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
        f"ensemble_scheduling {{ step [ {first} ] }}\n"
    )
    _ensemble(root, "mapped", text)
    steps = (
        '{ model_name: "requested_only" input_map { key: "X" value: "IN" } '
        'output_map { key: "C" value: "MID" } }, '
        '{ model_name: "requested_only" input_map { key: "X" value: "MID" } '
        'output_map { key: "A" value: "OUT" } }'
    )
    _ensemble(
        root,
        "chained",
        'platform: "ensemble"\nmax_batch_size: 4\n'
        'input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
        'output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
        f"ensemble_scheduling {{ step [ {steps} ] }}\n",
    )
    with serve_in_thread(_config(root), scan_repository(root)) as server:
        url = f"{server.url}/v2/models/mapped/infer"
        body: dict[str, Any] = {
            "inputs": [{"name": "IN", "shape": [1, 1], "datatype": "INT32", "data": [3]}]
        }
        answer = request_json("POST", url, body, timeout=30)
        assert [(o["name"], o["data"]) for o in answer["outputs"]] == [("OA", [30])]
        body["outputs"] = [{"name": "OC"}]
        assert request_json("POST", url, body, timeout=30)["outputs"] == []
        del body["outputs"]
        failed = httpx.post(f"{server.url}/v2/models/chained/infer", json=body, timeout=30)
        assert failed.status_code == 500
        assert (
            "did not return output C, which node requested_only_2 (model requested_only) "
            "needs as its input X" in failed.json()["error"]
        )
