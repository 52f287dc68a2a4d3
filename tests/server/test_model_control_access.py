"""Model control reaches only the repository's models, and only for the admin.

The drill behind these tests loaded ONNX files from outside the repository with
``POST /v2/repository/models/../load`` and with a path as the gRPC model name, read a
``config.yaml`` beside them (echoing its values), and unloaded models with no token.
"""

from __future__ import annotations

import http.client
import shutil
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import httpx
import pytest
import tritonclient.grpc as grpcclient
from click.testing import CliRunner
from tritonclient.utils import InferenceServerException

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.control.admin import TOKEN_ENV
from sordino.errors import ConfigError, ModelLoadError
from sordino.models.repository import load_repository_model, scan_repository
from sordino.server.observe import public_view
from sordino.testing import RunningServer, serve_in_thread

SIMPLE = Path(str(resources.files("sordino.models.builtin").joinpath("simple.onnx")))
TOKEN = "model-control-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SECRET = "AKIA-EXAMPLE-KEY"


def _model(folder: Path, *, secret_config: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(SIMPLE, folder / "model.onnx")
    if secret_config:
        # Not a model config at all: a credentials file that happens to sit there.
        (folder / "config.yaml").write_text(f"backend: {SECRET}\n")
    return folder


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """``tmp/repo/simple`` is the repository's one model; the rest lies outside it.

    ``tmp/model.onnx`` is what ``..`` reaches; ``tmp/outside/`` has a model and a
    config.yaml holding a secret; ``tmp/repo/escape`` is a symbolic link to it.
    """
    _model(tmp_path / "repo" / "simple")
    shutil.copyfile(SIMPLE, tmp_path / "model.onnx")
    outside = _model(tmp_path / "outside", secret_config=True)
    (tmp_path / "repo" / "escape").symlink_to(outside, target_is_directory=True)
    return tmp_path


def _serve(root: Path, token: str | None = None) -> Iterator[RunningServer]:
    overrides: dict[str, object] = {
        "model_repository": str(root / "repo"),
        "server.model_control_mode": "explicit",
    }
    if token is not None:
        overrides["server.admin_token"] = token
    config = load_config(None, overrides)
    with serve_in_thread(config, load_repository_model(root / "repo", "simple")) as running:
        yield running


@pytest.fixture
def open_server(layout: Path) -> Iterator[RunningServer]:
    """No token, on loopback: this test process may control models (the rule's default)."""
    yield from _serve(layout)


@pytest.fixture
def token_server(layout: Path) -> Iterator[RunningServer]:
    yield from _serve(layout, TOKEN)


def _raw_post(server: RunningServer, path: str, headers: dict[str, str] | None = None) -> int:
    """POST ``path`` exactly as written (httpx would remove the ``..``)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("POST", path, body=b"{}", headers=headers or {})
        response = connection.getresponse()
        body = response.read().decode()
        assert SECRET not in body
        return response.status
    finally:
        connection.close()


def _served(server: RunningServer) -> set[str]:
    return {m.key.name for m in server.runtime.models()}


# --- names are names, inside the repository --------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/v2/repository/models/../load",
        "/v2/repository/models/%2E%2E/load",
        "/v2/repository/models/..%2Foutside/load",
        "/v2/repository/models/%2Ftmp/load",
    ],
)
def test_http_load_of_a_path_is_refused(open_server: RunningServer, path: str) -> None:
    """``..`` (plain or encoded) and paths are not model names: nothing outside loads."""
    assert _raw_post(open_server, path) in (400, 404)
    assert _served(open_server) == {"simple"}


def test_http_unload_of_a_path_is_refused(open_server: RunningServer) -> None:
    assert _raw_post(open_server, "/v2/repository/models/../unload") == 400
    assert _served(open_server) == {"simple"}


@pytest.mark.parametrize("name", ["..", "../outside", "/", "outside/../..", "simple/../.."])
def test_grpc_load_of_a_relative_path_is_refused(
    open_server: RunningServer, layout: Path, name: str
) -> None:
    client = grpcclient.InferenceServerClient(open_server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.load_model(name)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "is not a model name" in info.value.message()
    assert _served(open_server) == {"simple"}


def test_grpc_load_of_an_absolute_path_is_refused(open_server: RunningServer, layout: Path) -> None:
    """A path to a folder with a model and a config.yaml: neither is read, nothing echoed."""
    client = grpcclient.InferenceServerClient(open_server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.load_model(str(layout / "outside"))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert SECRET not in info.value.message()
    with pytest.raises(InferenceServerException):
        client.unload_model(str(layout / "repo" / "simple"))
    assert _served(open_server) == {"simple"}


def test_a_symlink_out_of_the_repository_is_refused(open_server: RunningServer) -> None:
    """``repo/escape`` links to a folder outside: it is not loaded, over either protocol."""
    client = grpcclient.InferenceServerClient(open_server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        client.load_model("escape")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "leads outside the model repository" in info.value.message()
    assert SECRET not in info.value.message()
    assert _raw_post(open_server, "/v2/repository/models/escape/load") == 400
    assert _served(open_server) == {"simple"}


def test_a_model_file_linked_from_outside_is_refused(tmp_path: Path) -> None:
    """A link deeper in the model folder counts too: every file loaded lies inside."""
    outside = _model(tmp_path / "outside")
    folder = tmp_path / "repo" / "m" / "1"
    folder.mkdir(parents=True)
    (folder / "model.onnx").symlink_to(outside / "model.onnx")
    with pytest.raises(ModelLoadError, match="leads outside the model repository"):
        load_repository_model(tmp_path / "repo", "m")


def test_a_link_inside_the_repository_is_fine(tmp_path: Path) -> None:
    _model(tmp_path / "repo" / "real")
    (tmp_path / "repo" / "alias").symlink_to(tmp_path / "repo" / "real")
    (source,) = load_repository_model(tmp_path / "repo", "alias")
    assert source.name == "alias"


def test_a_folder_that_is_not_a_model_name_is_skipped(tmp_path: Path) -> None:
    _model(tmp_path / "repo" / "good")
    _model(tmp_path / "repo" / "not a name")
    assert [s.name for s in scan_repository(tmp_path / "repo")] == ["good"]


def test_a_secret_looking_name_in_config_yaml_is_not_echoed(tmp_path: Path) -> None:
    folder = _model(tmp_path / "repo" / "m")
    (folder / "config.yaml").write_text(f"name: {SECRET}\n")
    with pytest.raises(ConfigError) as info:
        load_repository_model(tmp_path / "repo", "m")
    assert SECRET not in str(info.value) and "differs from its folder 'm'" in str(info.value)


# --- the admin credential -----------------------------------------------------------------


def test_http_control_needs_the_token(token_server: RunningServer) -> None:
    """Index, load and unload answer 401 with a Bearer challenge without the token."""
    url = token_server.url
    for path in (
        "/v2/repository/index",
        "/v2/repository/models/simple/load",
        "/v2/repository/models/simple/unload",
    ):
        for headers in ({}, {"Authorization": "Bearer wrong-token"}):
            response = httpx.post(url + path, headers=headers)
            assert response.status_code == 401, path
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert "admin token" in response.json()["error"]
    assert _served(token_server) == {"simple"}
    assert _raw_post(token_server, "/v2/repository/models/../load") == 401
    index = httpx.post(url + "/v2/repository/index", headers=AUTH)
    assert index.status_code == 200 and index.json()[0]["name"] in ("escape", "simple")
    assert httpx.post(url + "/v2/repository/models/simple/unload", headers=AUTH).is_success
    assert _served(token_server) == set()
    assert httpx.post(url + "/v2/repository/models/simple/load", headers=AUTH).is_success
    assert _served(token_server) == {"simple"}
    # With the token, a path is still no name.
    assert _raw_post(token_server, "/v2/repository/models/../load", AUTH) == 400


def test_grpc_control_needs_the_token(token_server: RunningServer) -> None:
    client = grpcclient.InferenceServerClient(token_server.grpc_url)
    for call in (
        lambda h: client.get_model_repository_index(headers=h),
        lambda h: client.load_model("simple", headers=h),
        lambda h: client.unload_model("simple", headers=h),
    ):
        for headers in (None, {"authorization": "Bearer wrong-token"}):
            with pytest.raises(InferenceServerException) as info:
                call(headers)
            assert info.value.status() == "StatusCode.UNAUTHENTICATED"
    assert _served(token_server) == {"simple"}
    auth = {"authorization": f"Bearer {TOKEN}"}
    client.unload_model("simple", headers=auth)
    assert _served(token_server) == set()
    client.load_model("simple", headers=auth)
    assert client.is_model_ready("simple")
    with pytest.raises(InferenceServerException) as info:
        client.load_model("../outside", headers=auth)
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_profile_and_journal_need_the_token(token_server: RunningServer) -> None:
    url = token_server.url
    body = {"model": "simple", "seconds": 0.1}
    assert httpx.post(url + "/v2/sordino/profile", json=body).status_code == 401
    assert httpx.get(url + "/v2/sordino/journal").status_code == 401
    # This server keeps no journal: with the token the answer is that, not a refusal.
    assert httpx.get(url + "/v2/sordino/journal", headers=AUTH).status_code == 404


def test_telemetry_without_the_token_hides_the_internals(token_server: RunningServer) -> None:
    """The dashboard's endpoint stays open, without worker PIDs; the token shows them."""
    url = token_server.url
    public = httpx.get(url + "/v2/sordino/telemetry").json()
    full = httpx.get(url + "/v2/sordino/telemetry", headers=AUTH).json()
    assert (public["view"], full["view"]) == ("public", "full")
    assert public["workers"]["workers"] and "pid" not in public["workers"]["workers"][0]
    assert "pid" in full["workers"]["workers"][0]
    assert isinstance(full["workers"]["workers"][0]["pid"], int)
    assert public["workers"]["instances"] == full["workers"]["instances"]
    if public["workers"].get("arena"):
        assert "name" not in public["workers"]["arena"]


def test_the_public_view_drops_pids_and_paths() -> None:
    document = {
        "workers": {
            "workers": [{"pid": 4242, "last_cause": "restart failed: cannot read /srv/m.onnx"}],
            "arena": {"name": "psm_4242", "in_use_bytes": 0},
        },
        "events": [{"cause": "load failed: '/home/me/repo/m/1/model.onnx' is broken"}],
        "journal": {"path": "/var/lib/sordino/journal.sqlite3", "rows_written": 3},
    }
    text = str(public_view(document))
    assert "4242" not in text and "/srv" not in text and "/home" not in text
    assert "/var/lib" not in text
    assert document["events"][0]["cause"] == "load failed: '<path>' is broken"
    assert document["workers"]["workers"][0]["last_cause"] == "restart failed: cannot read <path>"
    assert document["journal"] == {"rows_written": 3} and document["view"] == "public"


def test_cli_models_sends_the_token(token_server: RunningServer) -> None:
    runner = CliRunner()
    refused = runner.invoke(cli, ["models", "list", "--url", token_server.url])
    assert refused.exit_code == 1 and "401" in refused.output
    listed = runner.invoke(cli, ["models", "list", "--url", token_server.url, "--token", TOKEN])
    assert listed.exit_code == 0 and "simple" in listed.output
    unloaded = runner.invoke(
        cli, ["models", "unload", "simple", "--url", token_server.url], env={TOKEN_ENV: TOKEN}
    )
    assert unloaded.exit_code == 0, unloaded.output
    assert _served(token_server) == set()
