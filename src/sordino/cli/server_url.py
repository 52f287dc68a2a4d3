"""Which server a client command talks to, and with which admin token.

``--url`` wins; without it, ``$SORDINO_URL``; without that, ``http://127.0.0.1:8000``
(where ``sordino start`` listens by default). ``models``, ``chaos``, ``monitor``,
``profile`` and ``diagnose`` all resolve it through :func:`server_url`. ``diagnose``
reads a server only when no ``--data-dir`` is given (see its help).

The commands that call protected endpoints (``models``, ``profile``, ``diagnose --url``)
take ``--token``, else ``$SORDINO_ADMIN_TOKEN``, and send it as a bearer token
(:func:`auth_headers`); a loopback server without a token needs none.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from sordino.config.addresses import http_url_problem
from sordino.control.client import TOKEN_ENV, AdminClient, ClientError

__all__ = [
    "DEFAULT_URL",
    "URL_ENV",
    "admin_client",
    "admin_options",
    "auth_headers",
    "model_name",
    "or_exit",
    "server_url",
    "token_option",
    "url_option",
]

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "SORDINO_URL"

F = TypeVar("F", bound=Callable[..., Any])


def server_url(*given: str | None) -> str:
    """The server: the first of ``given`` that is set, else $SORDINO_URL, else the default.

    ``given`` lists the ``--url`` values in force, the most specific first (a
    subcommand's own option before its group's).
    """
    for url in given:
        if url:
            return _checked(url, "--url")
    from_env = os.environ.get(URL_ENV)
    if from_env:
        return _checked(from_env, f"${URL_ENV}")
    return DEFAULT_URL


def _checked(url: str, source: str) -> str:
    """``url`` if it is an http(s) address with a host (and a valid port), else a usage error."""
    problem = http_url_problem(url)
    if problem is not None:
        raise click.UsageError(
            f"{source} {url!r} is not a server address ({problem}); give one like {DEFAULT_URL}"
        )
    return url.rstrip("/")


def model_name(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """A click callback for an argument or option naming a served model: refused when
    empty or blank (it would name the collection, ``/v2/models/``, and come back as a
    404 that names no model)."""
    if value is not None and not value.strip():
        raise click.BadParameter("give a model's name (see `sordino models list`)", ctx, param)
    return value


def url_option(command: F) -> F:
    """The ``--url`` option; None when not given (resolve it with :func:`server_url`)."""
    return click.option(
        "--url",
        default=None,
        metavar="URL",
        help=f"The server's HTTP address (default: ${URL_ENV}, else {DEFAULT_URL}).",
    )(command)


def token_option(command: F) -> F:
    """The ``--token`` option; None when not given (resolve it with :func:`auth_headers`)."""
    return click.option(
        "--token",
        default=None,
        metavar="TOKEN",
        help=f"The server's admin token (default: ${TOKEN_ENV}).",
    )(command)


def auth_headers(*given: str | None) -> dict[str, str]:
    """The ``Authorization`` header for the first of ``given`` set, else $SORDINO_ADMIN_TOKEN."""
    token = next((t for t in given if t), None) or os.environ.get(TOKEN_ENV)
    return {"Authorization": f"Bearer {token}"} if token else {}


def admin_options(command: F) -> F:
    """``--url`` and ``--token`` on a command group and its subcommands (before or after
    the subcommand's name); the group keeps its values in ``ctx.obj``."""
    command = click.option(
        "--token", default=None, help=f"Admin token or admin key (env {TOKEN_ENV})."
    )(command)
    return url_option(command)


def admin_client(ctx: click.Context, url: str | None, token: str | None) -> AdminClient:
    """The admin client for a subcommand: its own options win over its group's, which
    win over the environment."""
    chosen_url = server_url(url, ctx.obj["url"])
    chosen_token = token or ctx.obj["token"] or os.environ.get(TOKEN_ENV)
    return AdminClient(chosen_url, chosen_token)


def or_exit(call: Callable[[], Any]) -> Any:
    """``call()``, or ``error: …`` and exit 1 when the server refused or was not there."""
    try:
        return call()
    except ClientError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
