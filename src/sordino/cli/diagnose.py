"""``sordino diagnose``: explain a time window of the journal as an HTML or PDF report."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlencode

import click

from sordino.cli.client import ServerError, ServerUnreachable, get_json
from sordino.cli.report_files import (
    ReportFailure,
    check_output,
    open_journal,
    output_option,
    write_report,
)
from sordino.cli.server_url import URL_ENV, auth_headers, server_url, token_option
from sordino.reports.timerange import parse_time_range
from sordino.telemetry.profile_data import OperatorProfile

if TYPE_CHECKING:
    from sordino.telemetry.journal_reader import JournalWindow

__all__ = ["diagnose"]

_STEPS = 9  # read, baselines, anomalies, correlation, forecast, recommendations, 3 charts


def _from_journal(path: Path, time_range: str) -> tuple[JournalWindow, list[OperatorProfile]]:
    with open_journal(path) as reader:
        span = reader.span()
        if span is None:
            raise ReportFailure(
                f"the journal at {path} is empty: the server has not recorded a full second "
                "yet; send it traffic and try again in a few seconds"
            )
        start, end = _range(time_range, first=span[0])
        window = reader.window(start, end)
        profiles = [
            OperatorProfile.from_json(e.payload)
            for e in reader.latest_events("operator_profile", end)
            if e.t < start and "operators" in e.payload
        ]
    if not window.series:
        raise ReportFailure(
            f"the journal at {path} has no rows between {_when(start)} and {_when(end)}; it "
            f"covers {_when(span[0])} to {_when(span[1])}: choose a --time-range inside that"
        )
    return window, profiles


def _from_server(url: str, token: str | None, time_range: str) -> JournalWindow:
    start, end = _range(time_range, first=0.0)
    query = urlencode({"start": start, "end": end})
    path = f"/v2/sordino/journal?{query}"
    from sordino.telemetry.journal_reader import JournalWindow

    try:
        data = get_json(url, path, timeout=60, headers=auth_headers(token))
        window = JournalWindow.from_json(data)
    except (ServerUnreachable, ServerError) as exc:
        raise ReportFailure(str(exc)) from None
    if not window.series:
        raise ReportFailure(
            f"the server at {url} journaled nothing between {_when(start)} and {_when(end)}"
        )
    return window


def _range(text: str, *, first: float) -> tuple[float, float]:
    try:
        return parse_time_range(text, now=time.time(), first=first)
    except ValueError as exc:
        raise ReportFailure(str(exc)) from None


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


@click.command()
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    help="The server's data directory (its journal is read directly; default ~/.sordino).",
)
@click.option(
    "--url",
    metavar="URL",
    help=f"Read the journal of a running server instead (without --data-dir: ${URL_ENV} when set).",
)
@token_option
@click.option("--journal-file", default="journal.sqlite3", show_default=True)
@click.option(
    "--time-range",
    default="last_1h",
    show_default=True,
    help='last_30m, last_1h, last_2d, all, or "2026-12-01 10:00..11:00" (local time).',
)
@click.option(
    "--focus",
    type=click.Choice(["latency_spike", "memory", "errors", "all"]),
    default="all",
    show_default=True,
)
@output_option
def diagnose(
    data_dir: Path | None,
    url: str | None,
    token: str | None,
    journal_file: str,
    time_range: str,
    focus: str,
    output: Path,
) -> None:
    """Find anomalies in the journal, correlate them with events, recommend what to do.

    The journal is read from --data-dir, or from the server at --url; with neither, from
    the server at $SORDINO_URL when it is set, else from ~/.sordino. Reading a server's
    journal needs its admin token (--token, else $SORDINO_ADMIN_TOKEN) unless the server
    runs on loopback without one.
    """
    check_output(output)
    if data_dir is not None and url is not None:
        click.echo("error: give --data-dir or --url, not both", err=True)
        sys.exit(2)
    if data_dir is None and url is None and os.environ.get(URL_ENV):
        url = server_url()
    # Imported here, so that the other commands start without the report code.
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from sordino.reports.diagnose import diagnose as run
    from sordino.reports.diagnose import load_rise
    from sordino.reports.render import draw_charts, render_html, render_pdf

    console = Console(stderr=True)
    columns = (TextColumn("{task.description:<28}"), BarColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=False) as progress:
            task = progress.add_task("reading the journal", total=_STEPS)

            def step(name: str) -> None:
                progress.update(task, advance=1, description=name)

            profiles: list[OperatorProfile] = []
            if url is not None:
                window, source = _from_server(url, token, time_range), url
            else:
                directory = (data_dir or Path("~/.sordino")).expanduser()
                window, profiles = _from_journal(directory / journal_file, time_range)
                source = str(directory / journal_file)
            step("baselines")
            diagnosis = run(window, focus=focus, source=source, profiles=profiles, step=step)
            chart_list = draw_charts(diagnosis, step=step)
            progress.update(task, description=f"writing {output.name}")
            write_report(
                output,
                lambda: render_html(diagnosis, chart_list),
                lambda target: render_pdf(diagnosis, chart_list, target),
            )
            progress.update(task, completed=_STEPS, description="done")
    except ReportFailure as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"{len(diagnosis.anomalies)} finding(s); report written to {output}")
    if diagnosis.hidden:
        others = ", ".join(f"{k} ×{n}" for k, n in sorted(diagnosis.hidden.items()))
        click.echo(f"  outside --focus {focus}: {others} (--focus all shows them)")
    for anomaly in diagnosis.anomalies:
        cause = anomaly.likely_cause
        rise = load_rise(anomaly) if cause is None else None
        culprit = (
            f" — likely cause: {cause.event.kind} on {cause.event.subject}"
            if cause
            else f" — likely cause: {rise}"
            if rise
            else ""
        )
        click.echo(
            f"  {anomaly.kind} {anomaly.model or ''} {_when(anomaly.start)} .. "
            f"{_when(anomaly.end)}{culprit}"
        )
