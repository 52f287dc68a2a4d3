"""``sordino monitor``: a live terminal view of a running server (or one plain snapshot)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import click
from rich.console import Console
from rich.live import Live

from sordino.cli.client import ServerError, ServerUnreachable, get_json
from sordino.cli.monitor_view import METRICS, live_view, plain_snapshot, unreachable_view
from sordino.cli.server_url import server_url, url_option

__all__ = ["monitor"]


def _metrics(value: str) -> list[str]:
    chosen = [m.strip() for m in value.split(",") if m.strip()]
    unknown = [m for m in chosen if m not in METRICS]
    if unknown or not chosen:
        raise click.BadParameter(
            f"unknown metric(s) {', '.join(unknown) or '(none given)'}; choose from "
            f"{', '.join(METRICS)}"
        )
    return chosen


@click.command()
@url_option
@click.option(
    "--live/--once",
    default=True,
    help="Full-screen view (default; to a pipe or file: a snapshot every interval) or one "
    "snapshot.",
)
@click.option(
    "--metrics",
    "metric_list",
    default="qps,latency,error_rate,mem_frag",
    show_default=True,
    help=f"Comma-separated, from: {', '.join(METRICS)}.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes (at least 0.1).",
)
@click.option(
    "--history",
    type=click.IntRange(min=1),
    default=180,
    show_default=True,
    help="Seconds of sparkline history.",
)
@click.option(
    "--retries",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="With --once: attempts before giving up.",
)
def monitor(
    url: str | None, live: bool, metric_list: str, interval: float, history: int, retries: int
) -> None:
    """Watch a running server: a row per model with sparklines, resources and events."""
    metrics = _metrics(metric_list)
    url = server_url(url)
    path = f"/v2/sordino/telemetry?seconds={history}&events=20"
    if not live:
        for attempt in range(1, retries + 1):
            try:
                snap = get_json(url, path)
            except ServerUnreachable as exc:
                click.echo(f"{exc} (attempt {attempt} of {retries})", err=True)
                if attempt < retries:
                    time.sleep(interval)
                continue
            except ServerError as exc:
                click.echo(f"error: {exc}", err=True)
                sys.exit(1)
            click.echo(plain_snapshot(snap, metrics, url))
            return
        click.echo(f"error: no server answered at {url}; start one with `sordino start`", err=True)
        sys.exit(1)
    console = Console()
    if not console.is_terminal:
        # No terminal to draw on (a pipe, a file, a CI log): a plain snapshot every
        # interval, as ``top -b`` does (a full-screen view drawn there showed nothing
        # until it ended, and nothing at all when it was stopped).
        def printed(snap: dict[str, Any]) -> None:
            click.echo(plain_snapshot(snap, metrics, url) + "\n")
            sys.stdout.flush()

        def retrying(message: str, attempt: int) -> None:
            click.echo(f"{message} (retrying every {interval:g} s, attempt {attempt})", err=True)

        refused = _every(url, path, interval, printed, retrying)
    else:
        with Live(console=console, screen=True, auto_refresh=False) as view:
            refused = _every(
                url,
                path,
                interval,
                lambda snap: view.update(
                    live_view(snap, metrics, url, console.width), refresh=True
                ),
                lambda message, attempt: view.update(
                    unreachable_view(message, url, attempt), refresh=True
                ),
            )
    if refused is not None:  # (after the full-screen view is gone, so that it stays)
        click.echo(f"error: {refused}", err=True)
        sys.exit(1)


def _every(
    url: str,
    path: str,
    interval: float,
    show: Callable[[dict[str, Any]], None],
    failed: Callable[[str, int], None],
) -> str | None:
    """Read the snapshot every ``interval`` until Ctrl-C: ``show`` it, or say it
    ``failed`` (the message, and how many attempts in a row). An answer that asking
    again cannot change (a bad --history, a token refused) ends it: its message is
    returned (None after Ctrl-C)."""
    attempt = 0
    try:
        while True:
            try:
                snap = get_json(url, path)
            except (ServerUnreachable, ServerError) as exc:
                if isinstance(exc, ServerError) and exc.lasting:
                    return str(exc)
                attempt += 1
                failed(str(exc), attempt)
            else:
                attempt = 0
                show(snap)
            time.sleep(interval)
    except KeyboardInterrupt:
        return None
