"""Model control over HTTP, gRPC and the CLI: index, load, unload, reload under traffic, poll."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from click.testing import CliRunner
from tritonclient.utils import InferenceServerException

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.models.repository import scan_repository
from sordino.server.model_control import ModelControl
from sordino.server.runtime import Runtime
from sordino.testing import RunningServer, VirtualClock, serve_in_thread
from tests.server.helpers import Gate
from tests.waiting import wait_for

SIMPLE = Path(str(resources.files("sordino.models.builtin").joinpath("simple.onnx")))
ONES = np.ones((1, 16), dtype=np.int32)


def _add_version(repo: Path, version: int, name: str = "simple") -> None:
    folder = repo / name / str(version)
    folder.mkdir(parents=True)
    shutil.copyfile(SIMPLE, folder / "model.onnx")
    # Batches are held inside the backend (Gate), so the model runs on a server thread.
    (repo / name / "config.yaml").write_text("isolation: thread\n")


def _inputs() -> list[grpcclient.InferInput]:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(ONES)
        tensors.append(tensor)
    return tensors


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    _add_version(root, 1)
    return root


@pytest.fixture
def explicit(repo: Path) -> Iterator[RunningServer]:
    config = load_config(
        None,
        {"model_repository": str(repo), "server.model_control_mode": "explicit"},
    )
    with serve_in_thread(config, scan_repository(repo)) as running:
        yield running


def test_index_load_unload_over_grpc(explicit: RunningServer, repo: Path) -> None:
    client = grpcclient.InferenceServerClient(explicit.grpc_url)
    index = client.get_model_repository_index(as_json=True)["models"]
    assert index == [{"name": "simple", "version": "1", "state": "READY"}]
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    index = client.get_model_repository_index(as_json=True)["models"]
    # As Triton 2.51: the version it had, unloaded.
    assert index == [
        {"name": "simple", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    client.load_model("simple")
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as info:
        client.load_model("no-such-model")
    assert info.value.status() == "StatusCode.NOT_FOUND"
    assert "no-such-model" in info.value.message()


def test_index_load_unload_over_http(explicit: RunningServer, repo: Path) -> None:
    client = httpclient.InferenceServerClient(explicit.url[len("http://") :])
    assert client.get_model_repository_index() == [  # no empty reason, as on Triton
        {"name": "simple", "version": "1", "state": "READY"}
    ]
    client.unload_model("simple")
    assert not client.is_model_ready("simple")
    _add_version(repo, 2)
    client.load_model("simple")
    ready = client.get_model_repository_index()
    assert [(e["version"], e["state"]) for e in ready] == [("2", "READY")]


def test_cli_lists_loads_and_unloads(explicit: RunningServer) -> None:
    runner = CliRunner()
    listed = runner.invoke(cli, ["models", "list", "--url", explicit.url, "--json"])
    assert listed.exit_code == 0, listed.output
    assert '"state": "READY"' in listed.output
    unloaded = runner.invoke(
        cli, ["models", "unload", "simple", "--unload-dependents", "--url", explicit.url]
    )
    assert unloaded.exit_code == 0, unloaded.output  # not an ensemble: the flag changes nothing
    assert explicit.runtime.versions("simple") == []
    loaded = runner.invoke(cli, ["models", "load", "simple", "--url", explicit.url])
    assert loaded.exit_code == 0 and "loaded simple" in loaded.output
    table = runner.invoke(cli, ["models", "list", "--url", explicit.url])
    assert "simple" in table.output and "READY" in table.output
    missing = runner.invoke(cli, ["models", "load", "nope", "--url", explicit.url])
    assert missing.exit_code == 1 and "nope" in missing.output and "404" in missing.output


def test_new_version_drains_queued_requests_on_the_old_one(
    explicit: RunningServer, repo: Path
) -> None:
    client = grpcclient.InferenceServerClient(explicit.grpc_url)
    results: list[tuple[Any, Any]] = []
    lock = threading.Lock()

    def record(result: Any, error: Any) -> None:
        with lock:
            results.append((result, error))

    with Gate(explicit, "simple", "1") as gate:
        client.async_infer("simple", _inputs(), record)
        wait_for(gate.entered.is_set, "the held batch to start")
        for _ in range(2):  # queued on version 1 behind the held one
            client.async_infer("simple", _inputs(), record)
        queued = explicit.runtime.get("simple", "1").scheduler
        wait_for(lambda: queued.statistics().queue.depth == 2, "two requests queued on v1")
        _add_version(repo, 2)
        loader = threading.Thread(target=lambda: client.load_model("simple"))
        loader.start()
        wait_for(lambda: explicit.runtime.versions("simple") == ["2"], "v2 to take over")
        # New traffic goes to version 2 while version 1 is still draining.
        fresh = client.infer("simple", _inputs())
        assert fresh.get_response().model_version == "2"
        assert loader.is_alive()  # the unload of v1 waits for its queued requests
        gate.release()
        loader.join(60)
        assert not loader.is_alive()
    wait_for(lambda: len(results) == 3, "the drained requests to answer")
    assert all(error is None for _, error in results)
    assert {r.get_response().model_version for r, _ in results} == {"1"}
    assert sum(gate.rows) == 3


def test_reload_under_steady_load_loses_nothing(explicit: RunningServer, repo: Path) -> None:
    stop = threading.Event()
    failures: list[str] = []
    versions: list[str] = []
    lock = threading.Lock()

    def traffic(use_http: bool) -> None:
        grpc_client = grpcclient.InferenceServerClient(explicit.grpc_url)
        http_client = httpclient.InferenceServerClient(explicit.url[len("http://") :])
        for _ in range(5000):  # bounded; stops far earlier
            if stop.is_set():
                return
            try:
                if use_http:
                    inputs = []
                    for name in ("INPUT0", "INPUT1"):
                        tensor = httpclient.InferInput(name, [1, 16], "INT32")
                        tensor.set_data_from_numpy(ONES)
                        inputs.append(tensor)
                    version = http_client.infer("simple", inputs).get_response()["model_version"]
                else:
                    version = grpc_client.infer("simple", _inputs()).get_response().model_version
            except Exception as exc:
                with lock:
                    failures.append(repr(exc))
                return
            with lock:
                versions.append(version)

    workers = [threading.Thread(target=traffic, args=(i % 2 == 1,)) for i in range(4)]
    for worker in workers:
        worker.start()
    try:
        control = grpcclient.InferenceServerClient(explicit.grpc_url)
        wait_for(lambda: len(versions) >= 20, "traffic on version 1")
        _add_version(repo, 2)
        control.load_model("simple")
        seen = len(versions)
        wait_for(lambda: len(versions) >= seen + 20, "traffic on version 2")
        _add_version(repo, 3)
        (repo / "simple" / "2" / "model.onnx").unlink()
        control.load_model("simple")
        seen = len(versions)
        wait_for(lambda: len(versions) >= seen + 20, "traffic on version 3")
    finally:
        stop.set()
        for worker in workers:
            worker.join(60)
    assert failures == []
    assert {"1", "2", "3"} <= set(versions)
    assert versions[-1] == "3"


def test_load_and_unload_refused_without_model_control(server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.unload_model("simple")
    assert "model-control-mode explicit" in info.value.message()
    http = httpclient.InferenceServerClient(server.url[len("http://") :])
    with pytest.raises(InferenceServerException) as http_info:
        http.load_model("simple")
    assert "model control is off" in str(http_info.value.message())
    assert server.runtime.versions("simple") == ["1"]


async def test_poll_mode_follows_the_repository(repo: Path) -> None:
    clock = VirtualClock()
    config = load_config(
        None,
        {
            "model_repository": str(repo),
            "server.model_control_mode": "poll",
            "server.repository_poll_secs": "30s",
        },
    )
    runtime = Runtime(config, scan_repository(repo), clock=clock)
    await runtime.start()
    control = ModelControl(runtime)
    control.start()
    try:
        with pytest.raises(Exception, match="polled"):
            await control.load("simple")
        _add_version(repo, 2)
        shutil.copytree(repo / "simple", repo / "other")
        await clock.advance(29)
        assert control.statistics().polls == 0
        await clock.advance(1)

        def settled() -> bool:
            return runtime.versions("other") == ["2"] and runtime.versions("simple") == ["2"]

        await asyncio.to_thread(wait_for, settled, "the poll to load and drain")
        assert runtime.versions("simple") == ["2"]
        shutil.rmtree(repo / "other")
        await control.poll_once()
        assert runtime.versions("other") == []
        assert [e.name for e in control.index(ready_only=True)] == ["simple"]
        # An ensemble is left as it was at start-up; a config.pbtxt that cannot be read
        # is logged, and the poll goes on to the other models (it used to stop there).
        (repo / "chain" / "1").mkdir(parents=True)
        (repo / "chain" / "config.pbtxt").write_text('platform: "ensemble"\n')
        (repo / "broken" / "1").mkdir(parents=True)
        (repo / "broken" / "config.pbtxt").write_text("max_batch_size: {{\n")
        _add_version(repo, 4)
        await control.poll_once()
        await asyncio.to_thread(
            wait_for, lambda: runtime.versions("simple") == ["4"], "the poll past them"
        )
        assert runtime.versions("chain") == [] and runtime.versions("broken") == []
    finally:
        await control.close()
        await runtime.stop()


def _cut_short(model: Path, size: int) -> None:
    model.write_bytes(SIMPLE.read_bytes()[:size])


async def test_a_poll_tries_a_broken_model_again_only_once_its_files_change(
    repo: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A model file that cannot load (here cut short, as a copy still under way leaves
    it) was loaded again at every poll, a worker started each time and the same error
    logged: now it is tried again, and logged again, once its files change; the version
    loaded before serves on meanwhile (as Triton's poll)."""
    config = load_config(None, {"model_repository": str(repo), "server.model_control_mode": "poll"})
    runtime = Runtime(config, scan_repository(repo), clock=VirtualClock())
    await runtime.start()
    control = ModelControl(runtime)
    model = repo / "simple" / "1" / "model.onnx"
    try:
        _cut_short(model, 300)
        with caplog.at_level("ERROR", logger="sordino.control"):
            for _ in range(3):
                await control.poll_once()
        said = [r.getMessage() for r in caplog.records if r.name == "sordino.control"]
        assert len(said) == 1 and "could not start" in said[0], said
        assert control.statistics().reloads == 1  # before: 3, one a poll
        assert runtime.versions("simple") == ["1"]  # the first load serves on
        _cut_short(model, 200)  # changed, and broken still
        with caplog.at_level("ERROR", logger="sordino.control"):
            await control.poll_once()
        assert control.statistics().reloads == 2
        assert len([r for r in caplog.records if r.name == "sordino.control"]) == 1  # same words
        shutil.copyfile(SIMPLE, model)
        os.utime(model, ns=(1, 1))  # a new stamp, whatever the clock's resolution
        with caplog.at_level("ERROR", logger="sordino.control"):
            await control.poll_once()
            await control.poll_once()
        assert control.statistics().reloads == 3  # loaded, then nothing more to do
        assert control.statistics().failures == 2
        assert len([r for r in caplog.records if r.name == "sordino.control"]) == 1
    finally:
        await control.close()
        await runtime.stop()


def test_a_load_after_the_configuration_changed_reloads(
    explicit: RunningServer, repo: Path
) -> None:
    """Triton reloads a model whose configuration was edited; sordino compared the model
    file alone and kept serving the old configuration."""
    client = httpclient.InferenceServerClient(explicit.url.removeprefix("http://"))
    client.load_model("simple")  # (the first load reloads: nothing was loaded through it yet)
    assert client.get_model_config("simple")["max_batch_size"] != 4
    (repo / "simple" / "config.yaml").write_text("isolation: thread\nmax_batch_size: 4\n")
    client.load_model("simple")
    assert client.get_model_config("simple")["max_batch_size"] == 4
    assert explicit.control is not None
    reloads = explicit.control.statistics().reloads
    client.load_model("simple")  # nothing changed: nothing reloads
    assert explicit.control.statistics().reloads == reloads
    client.close()


def test_loading_a_model_served_since_start_up_unchanged_does_nothing(
    explicit: RunningServer,
) -> None:
    """Model control is built before the models load: it used to know none of them,
    so a load of an unchanged start-up model reloaded it (same version: unloaded, so
    requests meanwhile got 404, and its statistics restarted)."""
    client = httpclient.InferenceServerClient(explicit.url[len("http://") :])
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.int32))
        inputs.append(tensor)
    client.infer("simple", inputs)
    client.load_model("simple")
    stats = client.get_inference_statistics("simple")["model_stats"][0]
    assert stats["inference_count"] == 1
    assert explicit.control is not None and explicit.control.statistics().reloads == 0
