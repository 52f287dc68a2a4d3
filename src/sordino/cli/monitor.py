"""``sordino monitor``: a live terminal view of a running server (or one plain snapshot)."""

from __future__ import annotations

import sys
import time

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
@click.option("--interval", default=1.0, show_default=True, help="Seconds between refreshes.")
@click.option("--history", default=180, show_default=True, help="Seconds of sparkline history.")
@click.option(
    "--retries", default=3, show_default=True, help="With --once: attempts before giving up."
)
def monitor(
    url: str | None, live: bool, metric_list: str, interval: float, history: int, retries: int
) -> None:
    """Watch a running server: a row per model with sparklines, resources and events."""
    metrics = _metrics(metric_list)
    url = server_url(url)
    path = f"/v2/sordino/telemetry?seconds={max(1, history)}&events=20"
    if not live:
        for attempt in range(1, max(1, retries) + 1):
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
        _plain_stream(url, path, metrics, interval)
        return
    attempt = 0
    try:
        with Live(console=console, screen=True, auto_refresh=False) as view:
            while True:
                try:
                    snap = get_json(url, path)
                    attempt = 0
                    view.update(live_view(snap, metrics, url, console.width), refresh=True)
                except (ServerUnreachable, ServerError) as exc:
                    attempt += 1
                    view.update(unreachable_view(str(exc), url, attempt), refresh=True)
                time.sleep(interval)
    except KeyboardInterrupt:
        pass


def _plain_stream(url: str, path: str, metrics: list[str], interval: float) -> None:
    """``--live`` with no terminal to draw on (a pipe, a file, a CI log): a plain
    snapshot every ``interval``, as ``top -b`` does (a full-screen view drawn there showed
    nothing until it ended, and nothing at all when it was stopped)."""
    attempt = 0
    try:
        while True:
            try:
                snap = get_json(url, path)
            except (ServerUnreachable, ServerError) as exc:
                attempt += 1
                click.echo(f"{exc} (retrying every {interval:g} s, attempt {attempt})", err=True)
            else:
                attempt = 0
                click.echo(plain_snapshot(snap, metrics, url) + "\n")
                sys.stdout.flush()
            time.sleep(interval)
    except KeyboardInterrupt:
        pass
