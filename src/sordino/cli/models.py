"""``sordino models list|load|unload``: model control of a running server, over HTTP.

A thin client of the repository endpoints (``POST /v2/repository/index``,
``/v2/repository/models/{m}/load`` and ``/unload``). The server must run with
``--model-control-mode explicit`` for load and unload; its error says so otherwise.
These are protected endpoints: the admin token is sent from ``--token`` or
``$SORDINO_ADMIN_TOKEN``.
"""

from __future__ import annotations

import json
import sys
from typing import Any
from urllib.parse import quote

import click
from rich.console import Console
from rich.table import Table

from sordino.cli.server_url import auth_headers, server_url, token_option, url_option
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


@click.group()
def models() -> None:
    """List, load and unload the models of a running server."""


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
    table = Table("model", "version", "state", "reason", box=None)
    for entry in entries:
        table.add_row(entry["name"], entry["version"], entry["state"], entry.get("reason", ""))
    Console().print(table)


@models.command("load")
@click.argument("name")
@url_option
@token_option
def load_model(name: str, url: str | None, token: str | None) -> None:
    """Load NAME, or reload it: new versions load first, retired ones drain and unload."""
    _post(url, token, f"/v2/repository/models/{quote(name, safe='')}/load")
    click.echo(f"loaded {name}")


@models.command("unload")
@click.argument("name")
@url_option
@token_option
def unload_model(name: str, url: str | None, token: str | None) -> None:
    """Unload every version of NAME once its queued requests have finished."""
    _post(url, token, f"/v2/repository/models/{quote(name, safe='')}/unload")
    click.echo(f"unloaded {name}")
