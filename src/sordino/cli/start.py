"""``sordino start``: load models and serve them until Ctrl-C or SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import get_args

import click

from sordino.config import RuntimeConfig, SchedulerMode, load_config
from sordino.errors import ConfigError, SordinoError
from sordino.models.repository import (
    ModelSource,
    builtin_sources,
    model_from_spec,
    scan_repository,
    sources_for,
)
from sordino.server.lifecycle import open_server
from sordino.server.registry import LoadedModel

__all__ = ["collect_sources", "start"]

log = logging.getLogger("sordino")


def collect_sources(
    config: RuntimeConfig, specs: tuple[str, ...], builtin: bool | None
) -> list[ModelSource]:
    """Every model version to load: config entries, ``--model`` specs, the repository.

    The built-in models are added when ``builtin`` is true, or when it is None and no
    model source was named at all. A repository that holds no model is a
    configuration error when nothing at all would be served (model control ``none``),
    and a warning otherwise. Two models with the same name are a configuration error.
    """
    sources: list[ModelSource] = []
    for model in config.models:
        sources += sources_for(model)
    for spec in specs:
        sources += sources_for(model_from_spec(spec))
    if builtin or (builtin is None and not (sources or config.model_repository)):
        sources = builtin_sources() + sources
    if config.model_repository is not None:
        found = scan_repository(config.model_repository)
        if not found:
            _empty_repository(config.model_repository, config.server.model_control_mode, sources)
        sources += found
    seen: dict[tuple[str, str], ModelSource] = {}
    for source in sources:
        key = (source.name, source.version)
        if key in seen:
            raise ConfigError(
                f"model {source.name!r} version {source.version} is given twice "
                f"({seen[key].path} and {source.path}); rename one with --model name=path"
            )
        seen[key] = source
    if not sources and config.model_repository is None:
        raise ConfigError("no models to serve: give --model, --model-repository or --builtin")
    return sources


def _empty_repository(root: Path, mode: str, others: list[ModelSource]) -> None:
    """Refuse a repository without models when nothing would be served; warn otherwise."""
    layout = f"one folder per model, such as {root / 'NAME' / '1' / 'model.onnx'}"
    if mode == "none" and not others:
        raise ConfigError(
            f"model repository {root} holds no models, so there is nothing to serve: add "
            f"{layout}; or pass --builtin for the demo models, or --model-control-mode "
            "explicit or poll to add models while serving"
        )
    later = {
        "poll": "; poll mode loads them as they appear",
        "explicit": "; load them with `sordino models load NAME`",
    }.get(mode, "")
    log.warning("model repository %s holds no models (expected %s)%s", root, layout, later)


def _describe(model: LoadedModel) -> str:
    meta = model.metadata
    inputs = ", ".join(f"{s.name} {s.datatype}{list(s.shape)}" for s in meta.inputs)
    controller = model.scheduler.statistics().controller
    batching = (
        f"batch ≤{controller.max_batch}, mode {controller.effective_mode}"
        if model.max_batch_size
        else "no batching"
    )
    return f"loaded {meta.name} v{meta.version}: {inputs} ({batching})"


async def _serve(config: RuntimeConfig, sources: list[ModelSource]) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    journal = config.server.data_dir / config.telemetry.journal_file
    async with open_server(
        config,
        sources,
        journal=journal if config.telemetry.journal else None,
        on_journal=lambda path: click.echo(f"journal at {path}"),
        on_loaded=lambda model: click.echo(_describe(model)),
    ) as server:
        click.echo(
            f"sordino listening on {server.url} (KServe v2 HTTP, metrics at "
            f"{server.url}/metrics, dashboard at {server.url}/dashboard)"
        )
        click.echo(
            f"sordino listening on grpc://{server.grpc.address} (KServe v2 gRPC, "
            f"model control: {server.control.mode})"
        )
        await stop.wait()
        click.echo("shutting down: finishing queued requests", err=True)
    click.echo("stopped", err=True)


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help="runtime_config.yaml; flags override its values.",
)
@click.option(
    "--model",
    "models",
    multiple=True,
    metavar="[NAME=]PATH",
    help="An .onnx file or versioned folder to serve (repeatable).",
)
@click.option(
    "--model-repository",
    type=click.Path(path_type=Path, file_okay=False),
    help="A Triton-style folder: one sub-folder per model.",
)
@click.option(
    "--builtin/--no-builtin",
    default=None,
    help="Serve the built-in demo models (default: only when no model, --model or "
    "repository is given).",
)
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option("--http-port", type=int, help="HTTP port (default 8000; 0 picks a free port).")
@click.option("--grpc-port", type=int, help="gRPC port (default 8001; 0 picks a free port).")
@click.option(
    "--model-control-mode",
    type=click.Choice(["none", "explicit", "poll"]),
    help="none: fixed models; explicit: load/unload API; poll: follow the repository.",
)
@click.option(
    "--repository-poll-secs",
    type=float,
    help="How often poll mode rescans the repository (default 15).",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where sordino keeps its state (default ~/.sordino).",
)
@click.option(
    "--mode",
    type=click.Choice(get_args(SchedulerMode)),
    help="Scheduler mode for every model (overrides scheduler.mode).",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def start(
    config_path: Path | None,
    models: tuple[str, ...],
    model_repository: Path | None,
    builtin: bool | None,
    host: str | None,
    http_port: int | None,
    grpc_port: int | None,
    model_control_mode: str | None,
    repository_poll_secs: float | None,
    data_dir: Path | None,
    mode: str | None,
    log_level: str,
) -> None:
    """Load models and serve them over KServe v2 HTTP and gRPC until Ctrl-C or SIGTERM."""
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    overrides = {
        "server.host": host,
        "server.http_port": http_port,
        "server.grpc_port": grpc_port,
        "server.model_control_mode": model_control_mode,
        "server.repository_poll_secs": repository_poll_secs,
        "server.data_dir": str(data_dir) if data_dir else None,
        "scheduler.mode": mode,
        "model_repository": str(model_repository) if model_repository else None,
    }
    try:
        config = load_config(config_path, {k: v for k, v in overrides.items() if v is not None})
        sources = collect_sources(config, models, builtin)
        config.server.data_dir.mkdir(parents=True, exist_ok=True)
        _run(config, sources)
    except (SordinoError, OSError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)


def _run(config: RuntimeConfig, sources: list[ModelSource]) -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        asyncio.run(_serve(config, sources))
    else:
        uvloop.run(_serve(config, sources))
