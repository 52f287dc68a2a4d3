"""``sordino hints embed|show``: runtime hints inside an ONNX file (models/hints.py)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from sordino.cli.group import Group
from sordino.errors import SordinoError

__all__ = ["hints"]


def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


_MODEL = click.Path(path_type=Path, dir_okay=False, exists=True)


@click.group(cls=Group)
def hints() -> None:
    """Embed runtime hints into an ONNX model, or list the ones it carries."""


@hints.command("embed")
@click.argument("model", type=_MODEL)
@click.option("--max-batch", type=int, help="The model's max_batch_size.")
@click.option("--mode", help="The model's scheduler mode (adaptive, manual, conservative, ...).")
@click.option("--memory-pool", metavar="SIZE", help="The arena size it wants, e.g. 2GB.")
@click.option("--precision", help="fp32, fp16, int8 or int4.")
@click.option("--float-reference", metavar="PATH", help="A quantized model's float original.")
@click.option("--accuracy-bound", type=float, help="Least top-1 agreement with the float model.")
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True)
def embed(
    model: Path, max_batch: int | None, mode: str | None, memory_pool: str | None,
    precision: str | None, float_reference: str | None, accuracy_bound: float | None,
    output: Path,
) -> None:  # fmt: skip
    """Write MODEL to OUTPUT with the given hints in its metadata_props."""
    given: dict[str, Any] = {
        "max_batch_size": max_batch, "scheduler_mode": mode, "memory_pool": memory_pool,
        "precision": precision, "float_reference": float_reference,
        "accuracy_bound": accuracy_bound,
    }  # fmt: skip
    given = {key: value for key, value in given.items() if value is not None}
    if not given:
        _fail("no hints given: pass --max-batch, --mode, --memory-pool or --precision", 2)
    from pydantic import ValidationError

    from sordino.models.hints import ModelHints, embed_hints

    try:
        parsed = ModelHints.model_validate(given)
    except ValidationError as exc:
        error = exc.errors()[0]
        _fail(f"{error['loc'][0]}: {error['msg']} (got {error.get('input')!r})", 2)
    try:
        props = embed_hints(model, output, parsed)
    except (OSError, SordinoError) as exc:
        _fail(str(exc))
    except Exception as exc:  # onnx's own parse errors
        _fail(f"{model} is not an ONNX model: {exc}")
    for key, value in props.items():
        click.echo(f"{key} = {value}")
    click.echo(f"wrote {output}")


@hints.command("show")
@click.argument("model", type=_MODEL)
def show(model: Path) -> None:
    """List the runtime hints MODEL carries (a bad hint is reported as loading would)."""
    from sordino.models.hints import read_hints

    try:
        found = read_hints(model)
    except SordinoError as exc:
        _fail(str(exc))
    if found is None:
        click.echo(f"{model} carries no sordino runtime hints")
        return
    for key, value in found.as_props().items():
        click.echo(f"{key} = {value}")
