"""``--model-repository``, given once or more (Triton's flag, repeatable).

Triton's ``tritonserver`` takes ``--model-repository`` several times and serves the
models of all; so does ``sordino start`` (``models/repositories.py``: a model name in
two of them is refused, naming both). Click would keep the last value of an option that
is not ``multiple`` and drop the others in silence, so the option collects every one.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click

__all__ = ["repository_option", "repository_setting"]

F = TypeVar("F", bound=Callable[..., object])


def repository_option(function: F) -> F:
    """The ``--model-repository`` option of ``sordino start`` (a tuple of paths)."""
    option = click.option(
        "--model-repository",
        type=click.Path(path_type=Path, file_okay=False),
        multiple=True,
        help="A Triton-style folder: one sub-folder per model (repeatable: the models of "
        "every one, as Triton's).",
    )
    return option(function)


def repository_setting(given: tuple[Path, ...]) -> str | list[str] | None:
    """The option's values as the configuration's ``model_repository`` takes them: one
    path, or a list of them (None: not given)."""
    if not given:
        return None
    return str(given[0]) if len(given) == 1 else [str(path) for path in given]
