"""``sordino generate``: ask a served iterative model for an image, with a progress bar.

It streams ``POST /v2/models/<model>/generate_stream`` (Server-Sent Events): one event
per denoising step (a progress bar), then the final event with the PNG (base64), which
is written to ``--output``; with ``--num-images N`` > 1 the PNGs are ``OUT-1.png`` ..
``OUT-N.png`` (``--output``'s stem, a dash and the image's number). The options a
Stable Diffusion export takes (``--negative-prompt``, ``--width``, ``--height``,
``--num-images``, ``--image`` and ``--strength``) are sent only when given; a model
that does not take one answers a 400 naming it. Before streaming, the model's metadata
is read: a model that is not a generator (no ``prompt`` input, no ``png`` output) is
refused by name instead of being sent a prompt it cannot read.
"""

from __future__ import annotations

import base64
import json
import math
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from sordino.cli.client import ServerError, ServerUnreachable, get_json
from sordino.cli.server_url import model_name, server_url, url_option

__all__ = ["generate"]


def _finite(value: float | None, name: str) -> float | None:
    """``value`` unless it is NaN or infinite, which JSON cannot carry."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a finite number", param_hint=name)
    return value


@click.command(short_help="Generate an image for a prompt and write it as a PNG.")
@url_option
@click.argument("prompt")
@click.option(
    "--model", callback=model_name, default="digits-diffusion", show_default=True, help="The model."
)
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Denoising steps.")
@click.option("--seed", type=int, default=None, help="Seed (same seed, same image).")
@click.option(
    "--guidance",
    type=click.FloatRange(min=0),
    default=None,
    callback=lambda _ctx, _param, value: _finite(value, "--guidance"),
    help="Classifier-free guidance scale.",
)
@click.option("--negative-prompt", default=None, help="What the image should not show.")
@click.option("--width", type=click.IntRange(min=1), default=None, help="Image width (pixels).")
@click.option("--height", type=click.IntRange(min=1), default=None, help="Image height (pixels).")
@click.option(
    "--num-images",
    type=click.IntRange(min=1),
    default=None,
    help="Images for the prompt; more than one are written as OUTPUT-1.png, OUTPUT-2.png, ...",
)
@click.option(
    "--image",
    "image",
    type=click.Path(exists=True, dir_okay=False, readable=True, path_type=Path),
    default=None,
    help="Image to image: the starting image (PNG, JPEG, ...).",
)
@click.option(
    "--strength",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="Image to image: how much of the image is redrawn (0-1; the model's default 0.8).",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=Path("generated.png"),
    show_default=True,
    help="Where to write the PNG.",
)
@click.option("--priority", default=None, help="Priority: high, normal, low or a level.")
@click.option(
    "--timeout",
    "timeout_ms",
    type=click.IntRange(min=0),
    default=None,
    help="Deadline in ms (0: none).",
)
def generate(
    url: str | None,
    prompt: str,
    model: str,
    steps: int | None,
    seed: int | None,
    guidance: float | None,
    negative_prompt: str | None,
    width: int | None,
    height: int | None,
    num_images: int | None,
    image: Path | None,
    strength: float | None,
    output: Path,
    priority: str | None,
    timeout_ms: int | None,
) -> None:
    """Generate an image for PROMPT (e.g. "a handwritten 7") and write it as a PNG."""
    if strength is not None and image is None:
        raise click.UsageError("--strength applies to image to image: give --image too")
    body: dict[str, Any] = {"prompt": prompt}
    given = {
        "steps": steps,
        "seed": seed,
        "guidance": guidance,
        "negative_prompt": negative_prompt,
        "width": width,
        "height": height,
        "num_images": num_images,
        "strength": strength,
    }
    body.update({key: value for key, value in given.items() if value is not None})
    if image is not None:
        try:
            body["image"] = base64.b64encode(image.read_bytes()).decode("ascii")
        except OSError as exc:
            raise click.ClickException(f"cannot read {image}: {exc.strerror or exc}") from None
    parameters: dict[str, Any] = {}
    if priority is not None:
        parameters["priority"] = int(priority) if priority.isdigit() else priority
    if timeout_ms is not None:
        parameters["timeout"] = timeout_ms * 1000  # microseconds, as KServe's timeout
    if parameters:
        body["parameters"] = parameters
    base = server_url(url).rstrip("/")
    _check_generator(base, model)
    endpoint = f"{base}/v2/models/{model}/generate_stream"
    started = time.perf_counter()
    final: dict[str, Any] | None = None
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )  # fmt: skip

    console = Console(stderr=True)
    # Off a terminal (a pipe, a log file) a bar is noise: the bar is disabled, and the
    # console quiet, since rich before 15 still ended a disabled bar with a blank line.
    console.quiet = not console.is_terminal
    try:
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            disable=console.quiet,
        ) as bar:
            task = bar.add_task(f"{model}: {prompt[:40]}", total=steps)
            for event in _events(endpoint, body):
                if "error" in event:
                    raise click.ClickException(str(event["error"]))
                params = event.get("parameters", {})
                if "png" in event:
                    final = event
                    used = params.get("steps_used")
                    bar.update(task, total=used, completed=used)
                    break
                bar.update(task, total=params.get("steps"), completed=params.get("step", 0))
    except KeyboardInterrupt:
        click.echo("interrupted; the server cancels the generation", err=True)
        sys.exit(130)
    if final is None:
        raise click.ClickException("the server ended the stream without an image")
    pngs = final["png"] if isinstance(final["png"], list) else [final["png"]]
    paths = [output] if len(pngs) == 1 else [_numbered(output, i) for i in range(1, len(pngs) + 1)]
    for path, png in zip(paths, pngs, strict=True):
        try:
            path.write_bytes(base64.b64decode(png))
        except OSError as exc:
            raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from None
    written = str(output) if len(paths) == 1 else f"{paths[0]} .. {paths[-1]}"
    params = final.get("parameters", {})
    seconds = time.perf_counter() - started
    note = " (degraded under load)" if params.get("degraded") else ""
    if params.get("cached_steps"):
        note += f" ({params['cached_steps']} from the step cache)"
    source = params.get("source", "generated")
    click.echo(
        f"wrote {written}: {params.get('steps_used')} steps{note}, seed {params.get('seed')}, "
        f"{source}, {seconds * 1000:.0f} ms"
    )


def _numbered(output: Path, number: int) -> Path:
    """``out.png`` -> ``out-2.png``: where image ``number`` of several is written."""
    return output.with_name(f"{output.stem}-{number}{output.suffix or '.png'}")


def _check_generator(base: str, model: str) -> None:
    """Refuse, by name, a model that is unknown or not a generator (ClickException)."""
    try:
        metadata = get_json(base, f"/v2/models/{model}", timeout=30)
    except ServerUnreachable as exc:
        raise click.ClickException(f"{exc}; is `sordino start` running there?") from None
    except ServerError as exc:
        raise click.ClickException(str(exc)) from None
    if not isinstance(metadata, dict):
        raise click.ClickException(f"{base}/v2/models/{model} did not answer model metadata")
    inputs = {str(i.get("name")) for i in metadata.get("inputs", []) if isinstance(i, dict)}
    outputs = {str(o.get("name")) for o in metadata.get("outputs", []) if isinstance(o, dict)}
    if "prompt" not in inputs or "png" not in outputs:
        takes = ", ".join(sorted(inputs)) or "no input"
        gives = ", ".join(sorted(outputs)) or "no output"
        raise click.ClickException(
            f"model {model!r} is not a generator (it takes {takes} and gives {gives}); "
            "`sordino generate` needs "
            "one that takes a prompt and answers a PNG: digits-diffusion, or a served Stable "
            "Diffusion export (--model NAME)"
        )


def _events(url: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """POST ``body`` and yield each Server-Sent Event's JSON; ClickException on failure."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "Accept": "text/event-stream"},
    )
    try:
        response = urllib.request.urlopen(request, timeout=300)
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except (ValueError, AttributeError):
            message = exc.reason
        raise click.ClickException(f"{url} answered {exc.code}: {message}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise click.ClickException(
            f"cannot reach {url}: {reason}; is `sordino start` running there?"
        ) from None
    with response:
        try:
            for raw in response:
                line = raw.strip()
                if line.startswith(b"data:"):
                    yield json.loads(line[5:])
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"the stream from {url} broke off: {exc}") from None
