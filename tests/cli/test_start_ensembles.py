"""Triton ensembles in a model repository, through ``sordino start``: served as Triton
serves them, and a broken one stops start-up with its reason."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from sordino.config import load_config
from sordino.models.ensembles import ensemble_pipeline, only_named, with_ensembles
from sordino.models.repository import scan_repository
from tests.cli.conftest import sordino_start
from tests.waiting import wait_for

FIXTURES = Path(__file__).parent.parent / "fixtures"
EXAMPLES = FIXTURES / "triton_python_examples"
ENSEMBLES = FIXTURES / "triton_python_answers"


def _repository(into: Path) -> Path:
    repo = into / "models"
    for name in ("add_sub", "auto_complete"):
        shutil.copytree(EXAMPLES / name, repo / name)
    for name in ("ensemble_add_sub", "ensemble_batched"):
        shutil.copytree(ENSEMBLES / name, repo / name)
    return repo


def _inputs(mod: object, arrays: dict[str, np.ndarray]) -> list[object]:
    inputs = []
    for name, array in arrays.items():
        tensor = mod.InferInput(name, list(array.shape), "FP32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_a_repository_ensemble_is_served_as_triton_serves_it(tmp_path: Path) -> None:
    """Before, such a folder stopped start-up: "sordino does not load ensembles"."""
    repo = _repository(tmp_path)
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal(4).astype(np.float32) for _ in range(2))
    x, y = (rng.standard_normal((3, 4)).astype(np.float32) for _ in range(2))
    with sordino_start(["--model-repository", str(repo), "--no-builtin"], tmp_path) as server:
        http = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        wait_for(lambda: any("grpc://" in line for line in server.lines), "the gRPC URL", 60)
        address = next(line for line in server.lines if "grpc://" in line)
        grpc = grpcclient.InferenceServerClient(address.split("grpc://")[1].split()[0])
        for mod, client in ((httpclient, http), (grpcclient, grpc)):
            # Tensors named apart from the steps', steps listed last first, no batching.
            result = client.infer("ensemble_add_sub", _inputs(mod, {"A": a, "B": b}))
            np.testing.assert_allclose(result.as_numpy("TWICE_A"), (a + b) + (a - b))
            np.testing.assert_array_equal(result.as_numpy("diff"), a - b)
            # Batched: three rows through the batching example, twice.
            asked = [mod.InferRequestedOutput("SUM")]
            result = client.infer("ensemble_batched", _inputs(mod, {"X": x, "Y": y}), outputs=asked)
            np.testing.assert_array_equal(result.as_numpy("SUM"), x + y)
            assert result.as_numpy("DOUBLE_X") is None  # only what was asked
        metadata = http.get_model_metadata("ensemble_batched")
        assert metadata["platform"] == "ensemble"
        assert [(t["name"], t["shape"]) for t in metadata["inputs"]] == [
            ("X", [-1, 4]),
            ("Y", [-1, 4]),
        ]
        config = http.get_model_config("ensemble_add_sub")
        assert (config["platform"], config["backend"], config["max_batch_size"]) == (
            "ensemble",
            "",
            0,
        )
        steps = config["ensemble_scheduling"]["step"]
        assert [step["model_name"] for step in steps] == ["add_sub", "add_sub"]
        # As written in its config.pbtxt (last first), as Triton shows them.
        assert steps[0]["input_map"] == {"INPUT0": "sum", "INPUT1": "diff"}
        assert steps[1]["output_map"] == {"OUTPUT0": "sum", "OUTPUT1": "diff"}
        assert steps[1]["model_namespace"] == ""
        over_grpc = grpc.get_model_config("ensemble_add_sub", as_json=True)["config"]
        assert over_grpc["platform"] == "ensemble"
        grpc_steps = over_grpc["ensemble_scheduling"]["step"]
        assert [(s["model_name"], s["output_map"]) for s in grpc_steps] == [
            (step["model_name"], step["output_map"]) for step in steps
        ]
        index = {(m["name"], m.get("state")) for m in http.get_model_repository_index()}
        assert {("ensemble_add_sub", "READY"), ("ensemble_batched", "READY")} <= index
        http.close()
        grpc.close()


def test_a_broken_ensemble_stops_start_up_saying_what_to_fix(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    config = repo / "ensemble_add_sub" / "config.pbtxt"
    config.write_text(config.read_text().replace('value: "TWICE_A"', 'value: "TWICE"'))
    done = subprocess.run(
        [sys.executable, "-m", "sordino", "start", "--model-repository", str(repo),
         "--no-builtin", "--http-port", "0", "--grpc-port", "0",
         "--data-dir", str(tmp_path / "data")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "ensemble output 'TWICE_A' is produced by no step" in done.stderr
    assert str(config) in done.stderr


def test_load_model_starts_with_the_models_named_and_what_their_ensembles_run(
    tmp_path: Path,
) -> None:
    """As Triton's --load-model in explicit mode: the rest of the repository loads on
    request (sordino loaded every model at start-up, whatever the mode)."""
    repo = _repository(tmp_path)
    args = ["--model-repository", str(repo), "--no-builtin", "--model-control-mode",
            "explicit", "--load-model", "ensemble_add_sub"]  # fmt: skip
    with sordino_start(args, tmp_path) as server:
        http = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        states = {m["name"]: m.get("state", "") for m in http.get_model_repository_index()}
        assert states == {
            "add_sub": "READY",  # run by ensemble_add_sub
            "auto_complete": "",  # never loaded: its name alone, as on Triton
            "ensemble_add_sub": "READY",
            "ensemble_batched": "",
        }
        http.load_model("ensemble_batched")  # brings auto_complete
        assert http.is_model_ready("auto_complete") and http.is_model_ready("ensemble_batched")
        http.close()


def test_explicit_mode_without_load_model_starts_with_no_repository_model(
    tmp_path: Path,
) -> None:
    """As Triton: explicit model control loads what --load-model names, nothing else."""
    repo = _repository(tmp_path)
    args = ["--model-repository", str(repo), "--no-builtin", "--model-control-mode", "explicit"]
    with sordino_start(args, tmp_path) as server:
        http = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
        assert http.is_server_ready()
        assert [m for m in http.get_model_repository_index() if "state" in m] == []
        http.load_model("ensemble_add_sub")
        assert http.is_model_ready("ensemble_add_sub") and http.is_model_ready("add_sub")
        http.close()


def test_load_model_needs_explicit_mode_and_a_model_of_the_repository(tmp_path: Path) -> None:
    repo = _repository(tmp_path)
    base = [sys.executable, "-m", "sordino", "start", "--model-repository", str(repo),
            "--no-builtin", "--http-port", "0", "--data-dir", str(tmp_path / "data")]  # fmt: skip
    for extra, said in (
        (["--load-model", "add_sub"], "add --model-control-mode explicit"),
        (["--model-control-mode", "explicit", "--load-model", "nope"],
         "--load-model nope: not in the model repository"),
        (["--model-control-mode", "explicit", "--load-model", "*", "--load-model", "add_sub"],
         "--load-model '*' loads every model of the repository: give it alone"),
    ):  # fmt: skip
        done = subprocess.run([*base, *extra], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert said in done.stderr and "Traceback" not in done.stderr


def test_explicit_mode_keeps_what_the_pipelines_section_runs(tmp_path: Path) -> None:
    """The pipelines section is the configuration's own: in explicit mode without
    --load-model the repository models it runs still load, the rest does not."""
    repo = _repository(tmp_path)
    shutil.copytree(repo / "ensemble_add_sub", tmp_path / "twice")
    (tmp_path / "twice" / "config.pbtxt").write_text(
        (repo / "ensemble_add_sub" / "config.pbtxt")
        .read_text()
        .replace('name: "ensemble_add_sub"', 'name: "twice"')
    )
    config = load_config(
        None, {"model_repository": str(repo), "server.model_control_mode": "explicit"}
    )
    pipelines = with_ensembles((ensemble_pipeline(tmp_path / "twice"),), repo)
    sources, kept = only_named(config, (), scan_repository(repo), pipelines)
    assert {s.name for s in sources} == {"add_sub"}  # what "twice" runs
    assert [p.name for p in kept] == ["twice"]  # the repository's ensembles wait
