"""``--cache-config``, as Triton spells it: ``local,size=BYTES`` turns the response cache on.

Triton's ``--cache-config <cache>,<key>=<value>`` names a cache implementation and one
of its settings per use. sordino has Triton's ``local`` cache (in the server's memory,
``server/response_cache.py``) and its one setting, ``size``; another cache (``redis``)
or setting is refused with what to give instead.
"""

from __future__ import annotations

import click

from sordino.config.units import parse_size
from sordino.errors import ConfigError

__all__ = ["cache_size"]


def cache_size(
    context: click.Context, parameter: click.Parameter, values: tuple[str, ...]
) -> int | None:
    """The bytes the ``--cache-config`` values give the local cache (None: no cache)."""
    size: int | None = None
    for value in values:
        cache, _, setting = value.partition(",")
        key, _, given = setting.partition("=")
        if cache.strip() != "local":
            raise click.BadParameter(
                f"cache {cache.strip()!r} is not supported: sordino has Triton's local "
                "cache; give --cache-config local,size=BYTES",
                context,
                parameter,
            )
        if key.strip() != "size" or not given.strip():
            raise click.BadParameter(
                f"{value!r}: the local cache takes one setting, size (bytes): give "
                "--cache-config local,size=BYTES",
                context,
                parameter,
            )
        try:
            size = parse_size(given.strip())
        except ConfigError as exc:
            raise click.BadParameter(f"{value!r}: {exc}", context, parameter) from None
        if size < 1:
            raise click.BadParameter(f"{value!r}: size must be above 0", context, parameter)
    return size
