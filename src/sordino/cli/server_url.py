"""Which server a client command talks to: one ``--url`` option, one rule, every command.

``--url`` wins; without it, ``$SORDINO_URL``; without that, ``http://127.0.0.1:8000``
(where ``sordino start`` listens by default). ``models``, ``chaos``, ``monitor``,
``profile`` and ``diagnose`` all resolve it through :func:`server_url`. ``diagnose``
reads a server only when no ``--data-dir`` is given (see its help).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, TypeVar

import click

__all__ = ["DEFAULT_URL", "URL_ENV", "server_url", "url_option"]

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
            return url
    return os.environ.get(URL_ENV) or DEFAULT_URL


def url_option(command: F) -> F:
    """The ``--url`` option; None when not given (resolve it with :func:`server_url`)."""
    return click.option(
        "--url",
        default=None,
        metavar="URL",
        help=f"The server's HTTP address (default: ${URL_ENV}, else {DEFAULT_URL}).",
    )(command)
