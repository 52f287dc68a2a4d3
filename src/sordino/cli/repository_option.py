"""``--model-repository``: one folder, and a clear refusal of several.

Triton's ``tritonserver`` takes ``--model-repository`` several times and serves the
models of all; sordino serves one repository. Click would keep the last one given and
drop the others in silence (a Triton command line would lose models without a word),
so the option collects every value and refuses more than one, saying what to do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

__all__ = ["one_repository", "repository_option"]

F = TypeVar("F", bound=Callable[..., object])


def one_repository(given: tuple[Path, ...]) -> Path | None:
    """The repository given, None for none; more than one is a usage error."""
    if len(given) > 1:
        shown = ", ".join(str(path) for path in given)
        raise click.BadParameter(
            f"given {len(given)} times ({shown}): sordino serves one model repository "
            "(Triton takes several); copy the model folders into one and give that",
            param_hint="--model-repository",
        )
    return given[0] if given else None


def repository_option(function: F) -> F:
    """The ``--model-repository`` option of ``sordino start``."""
    option = click.option(
        "--model-repository",
        type=click.Path(path_type=Path, file_okay=False),
        multiple=True,
        callback=lambda _context, _parameter, given: one_repository(given),
        help="A Triton-style folder: one sub-folder per model.",
    )
    return option(function)
