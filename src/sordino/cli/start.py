"""``sordino start``: load models and serve them until Ctrl-C, SIGTERM or SIGHUP.

A signal during start-up cancels it (the workers already started are stopped): Ctrl-C
prints ``interrupted`` and exits 130 (SIGTERM: ``terminated``, 143; SIGHUP: ``hung up``,
129). Once serving, a signal stops the server gracefully (``cli/stop_signals.py``).
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args

import click

from sordino.cli.cache_config import cache_size
from sordino.cli.host_setup import make_data_dir, raise_open_file_limit
from sordino.cli.model_sources import collect_sources, left_out
from sordino.cli.repository_option import repository_option, repository_setting
from sordino.cli.stop_signals import (
    WORDS,
    leave_lost_terminal,
    stop_signals,
    terminal_streams,
)
from sordino.cli.switches import switch_option
from sordino.cli.trace_config import trace_settings
from sordino.config import RuntimeConfig, SchedulerMode, load_config
from sordino.errors import ConfigError, SordinoError
from sordino.execution.lost_streams import keep_standard_streams

# The server's modules (numpy, ONNX Runtime, gRPC, starlette) are imported when it starts,
# not when this module is: `sordino --help` and `sordino start --help` stay quick.
if TYPE_CHECKING:
    from sordino.models.repository import ModelSource
    from sordino.server.registry import LoadedModel

__all__ = ["collect_sources", "start"]

log = logging.getLogger("sordino")


def _describe(model: LoadedModel) -> str:
    meta = model.metadata
    inputs = ", ".join(f"{s.name} {s.datatype}{list(s.shape)}" for s in meta.inputs)
    controller = model.scheduler.statistics().controller
    if not model.max_batch_size:
        batching = "no batching"
    elif model.max_batch_size == controller.max_batch:
        batching = f"batch ≤{controller.max_batch}, mode {controller.effective_mode}"
    else:
        # A request may carry more rows than a batch the scheduler forms: say both.
        batching = (
            f"batch ≤{controller.max_batch}, ≤{model.max_batch_size} items per request, "
            f"mode {controller.effective_mode}"
        )
    return f"loaded {meta.name} v{meta.version}: {inputs} ({batching})"


INTERRUPTED = 128 + signal.SIGINT
"""The exit status after Ctrl-C, as a shell reports a process ended by SIGINT (130)."""


async def _serve(
    config: RuntimeConfig, sources: list[ModelSource], failed: dict[str, str] | None = None
) -> int:
    """Serve until SIGINT, SIGTERM or SIGHUP; return the exit status. ``failed``: the
    repository models left out before loading (``left_out``), UNAVAILABLE with their
    errors.

    During start-up a signal cancels it: what already started is stopped, one line
    says so (``interrupted``, ``terminated``, ``hung up``) and the status is 128 + the
    signal's number (130 for Ctrl-C). Once serving, a signal starts the graceful stop
    (status 0).
    """
    from sordino.server.lifecycle import open_server

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    serving = False
    interrupted_by: signal.Signals | None = None

    def on_signal(sig: signal.Signals) -> None:
        nonlocal interrupted_by
        if sig == signal.SIGHUP:
            leave_lost_terminal(terminal)
        if serving:
            stop.set()
        elif interrupted_by is None:  # later signals while start-up unwinds change nothing
            interrupted_by = sig
            main.cancel()

    terminal = terminal_streams()
    for sig in stop_signals():
        loop.add_signal_handler(sig, on_signal, sig)
    journal = config.server.data_dir / config.telemetry.journal_file
    try:
        async with open_server(
            config,
            sources,
            journal=journal if config.telemetry.journal else None,
            on_journal=lambda path: click.echo(f"journal at {path}"),
            on_loaded=lambda model: click.echo(_describe(model)),
            prepare=lambda runtime: runtime.failed_at_start.update(failed or {}),
        ) as server:
            serving = True
            # Start-up leaves a large heap (libraries, models, routes) that lives as long as
            # the process; moved out of the collector's view, the collections that requests
            # trigger no longer walk it (issue 16: a tenth of the front end's CPU).
            gc.freeze()
            # As the HTTP URL says https: with TLS on, the gRPC port wants TLS too.
            grpc_scheme = "grpcs" if config.server.tls is not None else "grpc"
            if server.frontends is not None:
                # Said once every front end listens: the lines below are true when printed.
                pids = ", ".join(str(pid) for pid in server.frontends.pids())
                click.echo(
                    f"front ends: {server.frontends.count} processes (pids {pids}) read the "
                    "client connections; this engine process reads none"
                )
            click.echo(
                f"sordino listening on {server.url} (KServe v2 HTTP, metrics at "
                f"{server.url}/metrics, dashboard at {server.url}/dashboard)"
            )
            click.echo(
                f"sordino listening on {grpc_scheme}://{server.grpc.address} (KServe v2 gRPC, "
                f"model control: {server.control.mode})"
            )
            await stop.wait()
            click.echo("shutting down: finishing queued requests", err=True)
    except asyncio.CancelledError:
        if interrupted_by is None or main.uncancel() > 0:
            raise
        click.echo(WORDS[interrupted_by], err=True)
        return 128 + interrupted_by
    click.echo("stopped", err=True)
    return 0


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
    help="An .onnx file or versioned folder to serve, or a model folder with its "
    "config.pbtxt or config.yaml (repeatable).",
)
@repository_option
@click.option(
    "--builtin/--no-builtin",
    default=None,
    help="Serve the built-in demo models (default: only when no model, --model or "
    "repository is given).",
)
@click.option(
    "--with-triton-examples",
    "triton_examples",
    is_flag=True,
    help="Also serve Triton's example models its client programs expect (simple_string, "
    "simple_identity, simple_int8, …; docs/http-api.md).",
)
@click.option("--host", help="Address to listen on (default 127.0.0.1).")
@click.option(
    "--http-port",
    type=int,
    help="HTTP port (default 8000; 0 picks a free port, and then a free gRPC port too "
    "unless --grpc-port or server.grpc_port is given).",
)
@click.option("--grpc-port", type=int, help="gRPC port (default 8001; 0 picks a free port).")
@click.option(
    "--frontends",
    type=int,
    help="Processes reading the HTTP and gRPC ports (server.frontends; default from the cores): "
    "1 = a single process; N > 1 = N front-end processes, the engine process reads none.",
)
@click.option(
    "--model-control-mode",
    type=click.Choice(["none", "explicit", "poll"]),
    help="none: fixed models; explicit: load/unload API; poll: follow the repository.",
)
@click.option(
    "--load-model",
    "load_models",
    multiple=True,
    metavar="NAME",
    help="With --model-control-mode explicit: load this repository model at start-up "
    "(repeatable; an ensemble brings the models it runs; '*' alone: every model; none "
    "given: no repository model), as Triton's --load-model.",
)
@click.option(
    "--cache-config",
    "cache_size",
    multiple=True,
    metavar="local,size=BYTES",
    callback=cache_size,
    help="Keep answers of models that enable response_cache, as Triton's local cache.",
)
@click.option(
    "--trace-config",
    "trace",
    multiple=True,
    metavar="[triton,]SETTING=VALUE",
    callback=trace_settings,
    help="Trace requests, as Triton: triton,file=PATH level=TIMESTAMPS.",
)
@click.option(
    "--repository-poll-secs",
    type=float,
    help="How often poll mode rescans the repository (default 15).",
)
@switch_option(
    "--exit-on-error",
    help="A model that fails to load ends start-up (default true, as Triton); false: it is "
    "left out, UNAVAILABLE with its error, and the others serve (server.exit_on_error).",
)
@switch_option(
    "--strict-readiness",
    help="/v2/health/ready only while every model is loaded (default true, as Triton); "
    "false: ready once start-up ends, models left out or not (server.strict_readiness).",
)
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="Where sordino keeps its state (default ~/.sordino); one server per data dir.",
)
@click.option(
    "--mode",
    type=click.Choice(get_args(SchedulerMode)),
    help="Scheduler mode for every model (overrides scheduler.mode).",
)
@click.option(
    "--memory-strategy",
    type=click.Choice(["fragmentation_aware", "best_fit", "simple"]),
    help="The shared-memory arena's allocator (memory.strategy).",
)
@switch_option(
    "--enable-memory-pool",
    "memory_pool",
    help="The memory manager: defragmentation, overflow protection, quotas (memory.enabled); "
    "given alone means true.",
)
@click.option(
    "--disable-memory-pool",
    "no_memory_pool",
    is_flag=True,
    help="Same as --enable-memory-pool false.",
)
@click.option(
    "--pool-size",
    help="The shared-memory arena's size, e.g. 2GB, or auto (memory.pool_size).",
)
@click.option("--pool-min", help="pool-size auto: the smallest arena, e.g. 64MB (memory.pool_min).")
@click.option("--pool-max", help="pool-size auto: the largest arena, e.g. 4GB (memory.pool_max).")
@click.option(
    "--defrag-interval", help="Defragment the arena this often, e.g. 5m; 0 = never on a timer."
)
@switch_option(
    "--guardian-mode",
    help="Run the guardian (self_healing.enabled): triggers that act on metrics; given alone "
    "means true.",
)
@click.option(
    "--alert-channel",
    "alert_channels",
    multiple=True,
    metavar="CHANNEL",
    help="Where guardian records go (repeatable): slack:#channel (URL in "
    "$SORDINO_SLACK_WEBHOOK; while unset, one warning and its alerts go to the log), "
    "webhook:URL, file:PATH, log.",
)
@click.option(
    "--insecure",
    is_flag=True,
    default=False,
    help="Serve on a non-loopback --host without auth.required (anyone who reaches the "
    "port may run inference).",
)
@switch_option(
    "--quant-aware",
    help="Guard quantized models against their float reference (quant_guard.enabled); given "
    "alone means true.",
)
@click.option(
    "--executor",
    "executor_kind",
    type=click.Choice(["process", "ray"]),
    help="Where model instances run (executor.kind): worker processes here, or Ray actors "
    "(pip install 'sordino[ray]'; docs/scale-out.md).",
)
@click.option(
    "--ray-address",
    help="The Ray cluster for --executor ray (executor.address): auto, host:port, ray://host:port.",
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
    model_repository: tuple[Path, ...],
    builtin: bool | None,
    triton_examples: bool,
    host: str | None,
    http_port: int | None,
    grpc_port: int | None,
    frontends: int | None,
    model_control_mode: str | None,
    load_models: tuple[str, ...],
    cache_size: int | None,
    trace: dict[str, Any],
    repository_poll_secs: float | None,
    exit_on_error: bool | None,
    strict_readiness: bool | None,
    data_dir: Path | None,
    mode: str | None,
    memory_strategy: str | None,
    memory_pool: bool | None,
    no_memory_pool: bool,
    pool_size: str | None,
    pool_min: str | None,
    pool_max: str | None,
    defrag_interval: str | None,
    guardian_mode: bool | None,
    alert_channels: tuple[str, ...],
    insecure: bool,
    quant_aware: bool | None,
    executor_kind: str | None,
    ray_address: str | None,
    log_level: str,
) -> None:
    """Load models and serve them over KServe v2 HTTP and gRPC until Ctrl-C, SIGTERM or
    a hang-up (SIGHUP, unless started under nohup).

    Exit status: 0 after a graceful stop, 2 when start-up fails (a bad configuration,
    a port or data dir in use, a model that cannot load unless --exit-on-error false),
    130 after Ctrl-C (143 after SIGTERM, 129 after SIGHUP) while models are still loading.
    """
    # Before the log's handler takes sys.stderr: a pipe whose reader goes away (`sordino
    # start | head`, a stopped tee) is then /dev/null for every line and log record that
    # follows, instead of a write that ends start-up or the stop; and one whose reader
    # does not read (a paused terminal) holds the output's thread, not the server.
    output = keep_standard_streams(background=True)
    if output is not None:  # its lines are out before the command ends, however it ends
        click.get_current_context().call_on_close(functools.partial(output.close, 2.0))
    logging.basicConfig(
        level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if no_memory_pool:
        if memory_pool:
            raise click.UsageError("give --enable-memory-pool or --disable-memory-pool, not both")
        memory_pool = False
    overrides = {
        "server.host": host,
        "server.http_port": http_port,
        "server.grpc_port": grpc_port,
        "server.frontends": frontends,
        "server.model_control_mode": model_control_mode,
        "server.repository_poll_secs": repository_poll_secs,
        "server.exit_on_error": exit_on_error,
        "server.strict_readiness": strict_readiness,
        "server.response_cache_size": cache_size,
        **{f"server.trace.{field}": value for field, value in trace.items()},
        "server.data_dir": str(data_dir) if data_dir else None,
        "scheduler.mode": mode,
        "memory.strategy": memory_strategy,
        "memory.enabled": memory_pool,
        "memory.pool_size": pool_size,
        "memory.pool_min": pool_min,
        "memory.pool_max": pool_max,
        "memory.defrag_interval": defrag_interval,
        "model_repository": repository_setting(model_repository),
        "self_healing.enabled": guardian_mode,
        "quant_guard.enabled": quant_aware,
        "self_healing.alert_channels": list(alert_channels) if alert_channels else None,
        "executor.kind": executor_kind,
        "executor.address": ray_address,
    }
    try:
        from sordino.control.admin import admin_token, exposure_refusal, exposure_warning
        from sordino.models.ensembles import only_named, with_ensembles
        from sordino.models.hints import with_runtime_hints

        config = load_config(config_path, {k: v for k, v in overrides.items() if v is not None})
        config = _free_grpc_port_with_free_http_port(config)
        # A too short $SORDINO_ADMIN_TOKEN stops start-up here; an open host is said out loud.
        refusal = exposure_refusal(config.server.host, config.auth.required, insecure=insecure)
        if refusal is not None:
            raise ConfigError(refusal)
        exposed = exposure_warning(config.server.host, admin_token(config.server.admin_token))
        if exposed is not None:
            log.warning("%s", exposed)
        explicit = config.server.model_control_mode == "explicit" and "*" not in load_models
        tolerant = explicit or not config.server.exit_on_error  # a folder that cannot be read
        broken: dict[str, str] | None = {} if tolerant else None
        sources = collect_sources(config, models, builtin, triton_examples, broken)
        ensembles = with_ensembles(config.pipelines, config.repositories, broken)
        failed = left_out(broken, config, load_models) if broken else {}
        if load_models or config.server.model_control_mode == "explicit":
            sources, ensembles = only_named(config, load_models, sources, ensembles)
            if not load_models and config.model_repository is not None:
                log.info("explicit model control: no repository model loads at start-up "
                         "(as Triton); load with `sordino models load NAME`, or name them "
                         "with --load-model ('*' for all)")  # fmt: skip
        config = config.model_copy(update={"pipelines": ensembles})
        config = with_runtime_hints(config, [source.path for source in sources])
        make_data_dir(config.server.data_dir)
        raise_open_file_limit()
        status = _run(config, sources, failed)
    except (SordinoError, OSError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except KeyboardInterrupt:  # Ctrl-C before the event loop took the signal over
        click.echo("interrupted", err=True)
        sys.exit(INTERRUPTED)
    if status:
        sys.exit(status)


def _free_grpc_port_with_free_http_port(config: RuntimeConfig) -> RuntimeConfig:
    """HTTP port 0 with no gRPC port given (flag or file): gRPC takes a free port too.

    Otherwise a second server started with ``--http-port 0`` alone would fail on the
    first one's gRPC port, 8001.
    """
    server = config.server
    if server.http_port != 0 or "grpc_port" in server.model_fields_set:
        return config
    return config.model_copy(update={"server": server.model_copy(update={"grpc_port": 0})})


def _run(config: RuntimeConfig, sources: list[ModelSource], failed: dict[str, str]) -> int:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency except on Windows
        return asyncio.run(_serve(config, sources, failed))
    return uvloop.run(_serve(config, sources, failed))
