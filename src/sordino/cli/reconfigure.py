"""``sordino reconfigure`` and ``sordino config show|history``: live configuration changes.

A thin client of the server's protected configuration endpoints
(``server/reconfigure_routes.py``): the admin token comes from ``--token`` or
``$SORDINO_ADMIN_TOKEN``. ``reconfigure`` waits for the verify window and prints
the outcome: kept, rolled back (exit 1) or refused (exit 1, naming each key that
needs a restart). docs/operations.md walks through it.
"""

from __future__ import annotations

import datetime
import getpass
import json
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from sordino.cli.group import Group
from sordino.cli.server_url import auth_headers, server_url, token_option, url_option
from sordino.control.client import ClientError, request_json
from sordino.errors import ConfigError, InvalidRequest

__all__ = ["change_config", "config", "get_json", "print_entry", "read_overlay", "reconfigure"]


def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def change_config(
    url: str | None,
    token: str | None,
    body: dict[str, Any],
    *,
    wait_s: float,
) -> dict[str, Any]:
    """POST a change; return the server's history entry, or exit 1 with its error."""
    body = {"who": _user(), **body}
    try:
        result: dict[str, Any] = request_json(
            "POST",
            server_url(url).rstrip("/") + "/v2/sordino/config",
            body,
            headers=auth_headers(token),
            timeout=wait_s + 60,
        )
    except ClientError as exc:
        _fail(str(exc))
    return result


def get_json(url: str | None, token: str | None, path: str) -> Any:
    try:
        return request_json(
            "GET", server_url(url).rstrip("/") + path, headers=auth_headers(token), timeout=30
        )
    except ClientError as exc:
        _fail(str(exc))


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def read_overlay(path: Path) -> dict[str, Any]:
    """The YAML mapping in ``path``; exit 2 with the reason when it is not one."""
    from sordino.config.bounded import load_yaml

    try:
        data = load_yaml(path.read_text(encoding="utf-8"), str(path))[0]
    except OSError as exc:
        _fail(f"cannot read {path}: {exc.strerror or exc}", 2)
    except UnicodeDecodeError:
        _fail(f"{path} is not UTF-8 text", 2)
    except ConfigError as exc:
        _fail(str(exc), 2)
    if data is None:
        return {}
    if not isinstance(data, dict):
        _fail(f"the top level of {path} must be a mapping of sections", 2)
    return data


def print_entry(entry: dict[str, Any]) -> None:
    """Print a change's keys (live or needing a restart) and its outcome."""
    for change in entry.get("changes", []):
        where = "live" if change["live"] else f"needs a restart: {change.get('why', '')}"
        click.echo(f"  {change['key']}: {change['old']!r} -> {change['new']!r}  ({where})")
    verdict = entry.get("verdict") or {}
    for model, after in sorted((verdict.get("after") or {}).items()):
        before = (verdict.get("before") or {}).get(model, {})
        click.echo(
            f"  {model}: p99 {before.get('p99_ms')} -> {after.get('p99_ms')} ms, errors "
            f"{before.get('error_rate')} -> {after.get('error_rate')} "
            f"({after.get('requests')} requests after)"
        )
    detail = f": {entry['detail']}" if entry.get("detail") else ""
    click.echo(f"snapshot #{entry['id']} {entry['result']}{detail}")


@click.command(short_help="Change the configuration of a running server.")
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="A dotted key and its new value (repeatable), e.g. scheduler.mode=conservative "
    "or models.digits-classifier.max_batch=16.",
)
@click.option("--memory-pool-size", metavar="SIZE", help="Same as --set memory.pool_size=SIZE.")
@click.option(
    "--file",
    "file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="A YAML file of sections to change (merged over the live configuration).",
)
@click.option("--dry-run", is_flag=True, help="Show the diff and what needs a restart only.")
@click.option("--no-rollback", is_flag=True, help="Keep the change even if it makes things worse.")
@click.option(
    "--verify-window",
    metavar="DURATION",
    help="How long to watch the effect before keeping it (default: reconfigure.verify_window).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the server's answer as JSON.")
@url_option
@token_option
def reconfigure(
    assignments: tuple[str, ...],
    memory_pool_size: str | None,
    file: Path | None,
    dry_run: bool,
    no_rollback: bool,
    verify_window: str | None,
    as_json: bool,
    url: str | None,
    token: str | None,
) -> None:
    """Apply a configuration change live: validated, watched, rolled back if worse.

    Keys that cannot change while the server runs (ports, TLS, the data dir) are
    refused, each named; a new memory.pool_size replaces the arena at the next quiet
    moment. Exit status: 0 kept (or dry run), 1 refused or rolled back, 2 bad arguments.
    """
    from sordino.config import parse_duration
    from sordino.config.reconfigure import MAX_VERIFY_WINDOW_S
    from sordino.operations.changes import parse_assignment

    settings: dict[str, Any] = {}
    try:
        for text in assignments:
            key, value = parse_assignment(text)
            settings[key] = value
    except InvalidRequest as exc:
        _fail(str(exc), 2)
    if memory_pool_size is not None:
        settings["memory.pool_size"] = memory_pool_size
    overlay = read_overlay(file) if file is not None else {}
    if not settings and not overlay:
        _fail("nothing to change: give --set KEY=VALUE, --memory-pool-size or --file", 2)
    body: dict[str, Any] = {"set": settings, "config": overlay, "dry_run": dry_run}
    wait_s = 120.0
    if verify_window is not None:
        try:
            wait_s = parse_duration(verify_window)
        except ConfigError as exc:
            _fail(f"--verify-window: {exc}", 2)
        if wait_s > MAX_VERIFY_WINDOW_S:
            _fail(f"--verify-window {verify_window} is longer than the longest window, 1h", 2)
        body["verify_window"] = wait_s
    if no_rollback:
        body["rollback"] = False
    entry = change_config(url, token, body, wait_s=max(wait_s, 120.0))
    if as_json:
        click.echo(json.dumps(entry, indent=2))
    else:
        print_entry(entry)
    if entry["result"] == "rolled_back":
        sys.exit(1)


@click.group(cls=Group)
def config() -> None:
    """Show the live configuration of a running server and its change history."""


@config.command("show")
@click.option("--json", "as_json", is_flag=True, help="JSON instead of YAML.")
@url_option
@token_option
def show(as_json: bool, url: str | None, token: str | None) -> None:
    """Print the live effective configuration (every served model's settings included)."""
    document = get_json(url, token, "/v2/sordino/config")
    if as_json:
        click.echo(json.dumps(document, indent=2))
    else:
        import yaml

        click.echo(yaml.safe_dump(document, sort_keys=False), nl=False)


@config.command("history")
@click.option("--json", "as_json", is_flag=True, help="Print the entries as JSON.")
@url_option
@token_option
def history(as_json: bool, url: str | None, token: str | None) -> None:
    """List the configuration changes since start-up: who, when, what, and the result."""
    entries = get_json(url, token, "/v2/sordino/config/history")["history"]
    if as_json:
        click.echo(json.dumps(entries, indent=2))
        return
    if not entries:
        click.echo("no configuration changes since start-up")
    for entry in entries:
        when = datetime.datetime.fromtimestamp(entry["at"], datetime.UTC).strftime("%H:%M:%S")
        keys = ", ".join(change["key"] for change in entry["changes"]) or "-"
        detail = f" ({entry['detail']})" if entry.get("detail") else ""
        click.echo(
            f"#{entry['id']} {when} {entry['who']} {entry['source']}: {entry['result']}{detail}"
            f" [{keys}]"
        )
