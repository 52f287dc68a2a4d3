"""``sordino models list|load|unload|export-builtin``: model control, and models to serve.

``list``, ``load`` and ``unload`` are a thin client of a running server's repository
endpoints (``POST /v2/repository/index``, ``/v2/repository/models/{m}/load`` and
``/unload``). The server must run with ``--model-control-mode explicit`` for load and
unload; its error says so otherwise. These are protected endpoints: the admin token is
sent from ``--token`` or ``$SORDINO_ADMIN_TOKEN``. ``export-builtin`` needs no server:
it writes the built-in models out as a model repository to serve, edit and reload.
"""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any, NoReturn, TextIO
from urllib.parse import quote

import click

from sordino.cli.group import Group
from sordino.cli.server_url import auth_headers, model_name, server_url, token_option, url_option
from sordino.control.client import ClientError, request_json

__all__ = ["models"]


def _post(
    url: str | None,
    token: str | None,
    path: str,
    body: dict[str, Any] | None = None,
    timeout: float = 600,
) -> Any:
    """POST JSON to the server; return the decoded reply, or exit 1 with the server's error."""
    try:
        return request_json(
            "POST",
            server_url(url).rstrip("/") + path,
            body or {},
            headers=auth_headers(token),
            timeout=timeout,
        )
    except ClientError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@click.group(cls=Group)
def models() -> None:
    """List, load and unload the models of a running server; export the built-in ones."""


@models.command("list")
@url_option
@token_option
@click.option("--ready", is_flag=True, help="Only models ready for inference.")
@click.option("--json", "as_json", is_flag=True, help="Print the index as JSON.")
def list_models(url: str | None, token: str | None, ready: bool, as_json: bool) -> None:
    """Show every model the server knows, with its version and state."""
    entries = _post(url, token, "/v2/repository/index", {"ready": ready}) or []
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("model", "version", "state", "reason", box=None)
    for entry in entries:
        table.add_row(
            entry["name"], entry.get("version", ""), entry.get("state", ""), entry.get("reason", "")
        )
    Console().print(table)


@models.command("load")
@click.argument("name", callback=model_name)
@click.option(
    "--config",
    "config_file",
    type=click.File("r", encoding="utf-8"),
    help="A JSON file of Triton's model configuration, used instead of the folder's.",
)
@click.option(
    "--file",
    "files",
    multiple=True,
    metavar="VERSION/FILE=PATH",
    help="Send PATH as the file VERSION/FILE of the model's folder (repeat it; with "
    "--config): the files sent make the whole folder, e.g. --file 1/model.onnx=./m.onnx.",
)
@url_option
@token_option
def load_model(
    name: str,
    config_file: TextIO | None,
    files: tuple[str, ...],
    url: str | None,
    token: str | None,
) -> None:
    """Load NAME, or reload it: new versions load first, a changed one is reloaded
    beside the one serving (an instance count changed alone: updated in place), retired
    ones drain and unload."""
    parameters: dict[str, str] = {}
    if config_file is not None:
        parameters["config"] = config_file.read()
    if files and config_file is None:
        raise click.UsageError(
            "--file needs --config: the files sent make the model's whole folder, and the "
            "config is its configuration"
        )
    for given in files:
        where, _, path = given.partition("=")
        if not where or not path:
            raise click.BadParameter(
                f"{given!r}: give VERSION/FILE=PATH, e.g. 1/model.onnx=./model.onnx",
                param_hint="--file",
            )
        try:
            content = Path(path).read_bytes()
        except OSError as exc:
            raise click.BadParameter(
                f"cannot read {path}: {exc.strerror}", param_hint="--file"
            ) from None
        parameters[f"file:{where}"] = base64.b64encode(content).decode("ascii")
    body = {"parameters": parameters} if parameters else None
    _post(url, token, f"/v2/repository/models/{quote(name, safe='')}/load", body)
    click.echo(f"loaded {name}")


@models.command("unload")
@click.argument("name", callback=model_name)
@click.option(
    "--unload-dependents",
    is_flag=True,
    help="NAME is an ensemble: unload the models it runs too (those no other runs).",
)
@url_option
@token_option
def unload_model(name: str, unload_dependents: bool, url: str | None, token: str | None) -> None:
    """Unload every version of NAME once its queued requests have finished."""
    body = {"parameters": {"unload_dependents": True}} if unload_dependents else None
    _post(url, token, f"/v2/repository/models/{quote(name, safe='')}/unload", body)
    click.echo(f"unloaded {name}")


@models.command("export-builtin", short_help="Write the built-in models to a folder.")
@click.argument("directory", type=click.Path(path_type=Path))
def export_builtin_models(directory: Path) -> None:
    """Write the built-in models to DIRECTORY as a model repository (new or empty folder).

    Each model gets DIRECTORY/NAME/1/model.onnx and DIRECTORY/NAME/config.yaml, so
    `sordino start --model-repository DIRECTORY` serves what the built-ins serve.
    """
    if directory.exists() and not directory.is_dir():
        _refuse(f"{directory} is a file; give a new or empty folder")
    if directory.is_dir() and any(directory.iterdir()):
        _refuse(f"{directory} is not empty; give a new or empty folder (nothing in it was changed)")
    from sordino.models.repository import MODEL_FILENAME, export_builtin

    try:
        folders = export_builtin(directory)
    except OSError as exc:
        _refuse(f"cannot write to {directory}: {exc.strerror or exc}")
    names = ", ".join(folder.name for folder in folders)
    click.echo(f"wrote {names} to {directory} (NAME/config.yaml, NAME/1/{MODEL_FILENAME})")
    click.echo(f"serve them with: sordino start --model-repository {directory}")


def _refuse(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)
