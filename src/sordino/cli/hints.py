"""``sordino hints embed|show``: runtime hints inside an ONNX file (models/hints.py)."""

from __future__ import annotations

import json
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
@click.option(
    "--memory-strategy",
    help="The arena's placement strategy: fragmentation_aware, best_fit or simple.",
)
@click.option(
    "--iterative",
    metavar="JSON",
    help="Serve it as a generator with this iterative: entry, e.g. '{\"guidance\": 3.0}'.",
)
@click.option(
    "--step-cache",
    metavar="THRESHOLD",
    type=float,
    help="Turn on step caching of a generator with this threshold (0 to 1; 0 never skips).",
)
@click.option(
    "--auto",
    is_flag=True,
    help="Also embed what sordino picks for the file: fragmentation_aware placement, and "
    "for a denoiser, generator serving with step caching (the default when no hint is named).",
)
@click.option(
    "--embed-runtime-hints",
    "embed_runtime_hints",
    type=click.BOOL,
    metavar="true|false",
    help="ATC's spelling: true is --auto; false embeds only the hints named.",
)
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True)
def embed(
    model: Path, max_batch: int | None, mode: str | None, memory_pool: str | None,
    precision: str | None, float_reference: str | None, accuracy_bound: float | None,
    memory_strategy: str | None, iterative: str | None, step_cache: float | None,
    auto: bool, embed_runtime_hints: bool | None, output: Path,
) -> None:  # fmt: skip
    """Write MODEL to OUTPUT with the given hints in its metadata_props.

    With no hint named (ATC's --embed-runtime-hints true), the hints sordino picks for
    the file are embedded (--auto).
    """
    given: dict[str, Any] = {
        "max_batch_size": max_batch, "scheduler_mode": mode, "memory_pool": memory_pool,
        "precision": precision, "float_reference": float_reference,
        "accuracy_bound": accuracy_bound, "memory_strategy": memory_strategy,
        "iterative": iterative, "step_cache": step_cache,
    }  # fmt: skip
    given = {key: value for key, value in given.items() if value is not None}
    if embed_runtime_hints is False:
        if auto:
            _fail("--auto and --embed-runtime-hints false contradict each other; pass one", 2)
        if not given:
            _fail("--embed-runtime-hints false and no hint named: nothing to embed", 2)
    elif embed_runtime_hints or auto or not given:
        try:
            picked = auto_hints(model)
        except Exception as exc:  # ONNX Runtime's own parse errors
            _fail(f"{model} is not an ONNX model: {exc}")
        if isinstance(given.get("iterative"), str) and "iterative" in picked:
            # --iterative beside --auto: what the file says (its sample shape) fills in.
            try:
                named = json.loads(given["iterative"])
            except ValueError:
                named = None  # refused below, with the reason
            if isinstance(named, dict):
                given["iterative"] = {**picked["iterative"], **named}
        given = {**picked, **given}
    from pydantic import ValidationError

    from sordino.models.hints import ModelHints, embed_hints

    try:
        parsed = ModelHints.model_validate(given)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        message = str(error["msg"]).removeprefix("Value error, ")
        _fail(f"{where}: {message} (got {error.get('input')!r})", 2)
    try:
        props = embed_hints(model, output, parsed)
    except (OSError, SordinoError) as exc:
        _fail(str(exc))
    except Exception as exc:  # onnx's own parse errors
        _fail(f"{model} is not an ONNX model: {exc}")
    for key, value in props.items():
        click.echo(f"{key} = {value}")
    click.echo(f"wrote {output}")


def auto_hints(model: Path) -> dict[str, Any]:
    """The hints sordino picks for ``model`` (``--auto``).

    Every model: ``fragmentation_aware`` placement (size tiers and lifetime classes
    keep the arena's free space in few large pieces). A denoiser — inputs named as
    ``iterative:`` expects them (``sample``, ``timestep``, ``condition``) and an output
    ``noise`` — is also served as a generator (its sample shape read from the file),
    with step caching at the default threshold.
    """
    import onnxruntime as ort

    from sordino.config.iterative import IterativeConfig, StepCacheConfig

    picked: dict[str, Any] = {"memory_strategy": "fragmentation_aware"}
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    inputs = {i.name: i.shape for i in session.get_inputs()}
    outputs = {o.name for o in session.get_outputs()}
    entry = IterativeConfig()
    wanted = {entry.sample_input, entry.timestep_input, entry.condition_input}
    if wanted <= set(inputs) and entry.noise_output in outputs:
        shape = inputs[entry.sample_input][1:]
        iterative: dict[str, Any] = {}
        if shape and all(isinstance(d, int) and d > 0 for d in shape):
            iterative["sample_shape"] = list(shape)
        picked["iterative"] = iterative
        picked["step_cache"] = StepCacheConfig().threshold
    return picked


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
