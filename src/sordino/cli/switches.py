"""On/off options written either way: ``--guardian-mode`` or ``--guardian-mode true``.

The brief writes its switches with an explicit value (``--enable-memory-pool true``,
``--quant-aware true``); people also write them as plain flags. A switch takes an
optional ``true|false`` (click's optional-value option: ``flag_value`` with
``is_flag=False``), so both forms mean the same, and ``--x false`` turns it off.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

__all__ = ["switch_option"]

F = TypeVar("F", bound=Callable[..., object])


def switch_option(*decls: str, help: str) -> Callable[[F], F]:
    """An option that is ``None`` when absent, ``True`` when given alone, and the parsed
    boolean (true/false, yes/no, on/off, 1/0) when given a value."""
    return click.option(
        *decls,
        type=click.BOOL,
        is_flag=False,
        flag_value=True,
        default=None,
        metavar="[true|false]",
        help=help,
    )
