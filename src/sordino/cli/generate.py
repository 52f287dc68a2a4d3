"""``sordino generate``: ask a served iterative model for an image, with a progress bar.

It streams ``POST /v2/models/<model>/generate_stream`` (Server-Sent Events): one event
per denoising step (a progress bar), then the final event with the PNG (base64), which
is written to ``--output``.
"""

from __future__ import annotations

import base64
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from sordino.cli.server_url import server_url, url_option

__all__ = ["generate"]


@click.command(short_help="Generate an image for a prompt and write it as a PNG.")
@url_option
@click.argument("prompt")
@click.option("--model", default="digits-diffusion", show_default=True, help="The model.")
@click.option("--steps", type=click.IntRange(min=1), default=None, help="Denoising steps.")
@click.option("--seed", type=int, default=None, help="Seed (same seed, same image).")
@click.option("--guidance", type=float, default=None, help="Classifier-free guidance scale.")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=Path("generated.png"),
    show_default=True,
    help="Where to write the PNG.",
)
@click.option("--priority", default=None, help="Priority: high, normal, low or a level.")
@click.option("--timeout", "timeout_ms", type=int, default=None, help="Deadline in ms.")
def generate(
    url: str | None,
    prompt: str,
    model: str,
    steps: int | None,
    seed: int | None,
    guidance: float | None,
    output: Path,
    priority: str | None,
    timeout_ms: int | None,
) -> None:
    """Generate an image for PROMPT (e.g. "a handwritten 7") and write it as a PNG."""
    body: dict[str, Any] = {"prompt": prompt}
    if steps is not None:
        body["steps"] = steps
    if seed is not None:
        body["seed"] = seed
    if guidance is not None:
        body["guidance"] = guidance
    parameters: dict[str, Any] = {}
    if priority is not None:
        parameters["priority"] = int(priority) if priority.isdigit() else priority
    if timeout_ms is not None:
        parameters["timeout"] = timeout_ms * 1000  # microseconds, as KServe's timeout
    if parameters:
        body["parameters"] = parameters
    base = server_url(url).rstrip("/")
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
    try:
        with Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            # Off a terminal (a pipe, a log file) a bar is noise: rich would still end
            # it with a blank line on stderr.
            disable=not console.is_terminal,
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
    try:
        output.write_bytes(base64.b64decode(final["png"]))
    except OSError as exc:
        raise click.ClickException(f"cannot write {output}: {exc.strerror or exc}") from None
    params = final.get("parameters", {})
    seconds = time.perf_counter() - started
    note = " (degraded under load)" if params.get("degraded") else ""
    if params.get("cached_steps"):
        note += f" ({params['cached_steps']} from the step cache)"
    source = params.get("source", "generated")
    click.echo(
        f"wrote {output}: {params.get('steps_used')} steps{note}, seed {params.get('seed')}, "
        f"{source}, {seconds * 1000:.0f} ms"
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
