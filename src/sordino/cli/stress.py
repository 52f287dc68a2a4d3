"""``sordino stress-test``: open-loop load from a traffic profile, and a report of it.

Exit status: 0 when the run finished and no ``--fail-on`` condition held; 3 when one
did (for CI); 4 when more than half of the answers were client errors (4xx but 429:
the server refused the requests themselves, so the run measured no serving); 1 when
the run could not happen (no server, no model, a bad profile); 2 for a bad flag; 130
on Ctrl-C (whatever was measured so far is not reported).

Against a sordino server that names its journal (a loopback one, or ``--token``), the
run is marked as an event in that journal, a start mark before the first request and
an end mark after the last answer, named ``--event`` (default: the ``--profile`` as
written, ``black_friday_2024``), so that ``sordino postmortem --event NAME`` finds it.
A server started for a ``--model`` file runs on the default data directory
(``~/.sordino``, so its journal outlives the run), or on a temporary one when a server
already holds that one; then the run is not marked.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sordino.cli.report_files import ReportFailure, write_output
from sordino.cli.server_url import URL_ENV, model_name, server_url
from sordino.cli.stress_server import Failure, is_model_file, own_server
from sordino.control.client import TOKEN_ENV
from sordino.errors import ConfigError

if TYPE_CHECKING:
    from sordino.loadtest.profiles import Profile
    from sordino.loadtest.results import Condition
    from sordino.loadtest.sender import Progress as LiveProgress

__all__ = ["CLIENT_ERRORS", "FAILED_CONDITION", "stress_test"]

FAILED_CONDITION = 3
"""The exit status when a ``--fail-on`` condition held."""
CLIENT_ERRORS = 4
"""The exit status when most answers were client errors (and no ``--fail-on`` held)."""

_LISTENING = re.compile(r"listening on (http://\S+)")


def _duration(value: str | None, option: str) -> float | None:
    if value is None:
        return None
    from sordino.config.units import parse_duration

    try:
        seconds = parse_duration(value)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint=option) from None
    if seconds <= 0:
        raise click.BadParameter("must be more than 0", param_hint=option)
    return seconds


@click.command(name="stress-test")
@click.option(
    "--url",
    default=None,
    metavar="URL",
    help=f"A running KServe v2 server (default: ${URL_ENV}, else http://127.0.0.1:8000"
    "; without --url, a --model path starts its own server).",
)
@click.option(
    "--model",
    callback=model_name,
    default=None,
    metavar="NAME|PATH",
    help="The model to call: its name on the server, or a model file (then a server "
    "is started for it unless --url is given).",
)
@click.option(
    "--profile",
    default="steady",
    show_default=True,
    metavar="NAME|FILE",
    help="steady, ramp, spike, diurnal, black_friday, one of them with a year "
    "(black_friday_2024 is black_friday), or a profile file.",
)
@click.option(
    "--event",
    "event_name",
    default=None,
    metavar="NAME",
    help="Mark the run as this event in the server's journal, for `sordino postmortem "
    "--event NAME` (default: the --profile as written).",
)
@click.option(
    "--duration",
    default=None,
    metavar="DURATION",
    help="Stretch the profile to this long (30s, 10m, 2h).",
)
@click.option(
    "--peak-rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Scale the profile so its highest rate is this many requests/s.",
)
@click.option(
    "--arrivals",
    type=click.Choice(["poisson", "constant"]),
    default=None,
    help="Override the profile's arrival process.",
)
@click.option(
    "--data",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    default=None,
    help="Input tensors in perf_analyzer's input-data JSON (else random).",
)
@click.option(
    "--slo",
    "slos",
    multiple=True,
    metavar="[CLASS:]METRIC<VALUE",
    help='A target to report attainment for, e.g. "premium:p99<3s" (repeatable).',
)
@click.option(
    "--fail-on",
    default=None,
    metavar="[CLASS:]METRIC>VALUE[,...]",
    help=f'Exit {FAILED_CONDITION} if one holds, e.g. "p99>3s,errors>1%".',
)
@click.option(
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the HTML report here.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the measurements as JSON here ('-' for standard output).",
)
@click.option(
    "--apply-suggestions",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    metavar="FILE",
    help="Merge the suggested configuration into this file.",
)
@click.option(
    "--config",
    "server_config",
    default=None,
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="The config file of the server started for a --model path.",
)
@click.option(
    "--max-in-flight",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="The most requests in flight at once (the connection pool).",
)
@click.option(
    "--timeout",
    "timeout",
    default="60s",
    show_default=True,
    help="A request unanswered this long counts as a timeout.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of arrivals and data.")
@click.option(
    "--token",
    default=None,
    metavar="TOKEN",
    help="The server's admin token, to read its journal after the run (default: "
    "$SORDINO_ADMIN_TOKEN; a loopback server without one needs none).",
)
def stress_test(
    url: str | None,
    model: str | None,
    profile: str,
    event_name: str | None,
    duration: str | None,
    peak_rate: float | None,
    arrivals: str | None,
    data: Path | None,
    slos: tuple[str, ...],
    fail_on: str | None,
    output: Path | None,
    json_path: Path | None,
    apply_suggestions: Path | None,
    server_config: Path | None,
    max_in_flight: int,
    timeout: str,
    seed: int,
    token: str | None,
) -> None:
    """Send open-loop traffic from a profile and report latency, errors and findings.

    Every latency runs from the request's intended send time, so a server stall shows
    in the percentiles. Works against any KServe v2 server; against sordino it also
    reads /metrics during the run.
    """
    if output is not None and output.suffix.lower() not in (".html", ".htm"):
        raise click.BadParameter(f"must end in .html, not {output.name!r}", param_hint="--output")
    seconds = _duration(duration, "--duration")
    timeout_s = _duration(timeout, "--timeout") or 60.0
    # Imported here, so that the other commands start without numpy, aiohttp and hdrh.
    from sordino.loadtest.profiles import load_profile
    from sordino.loadtest.results import parse_conditions

    try:
        chosen = load_profile(profile).scaled(duration=seconds, peak_rate=peak_rate)
        if arrivals is not None:
            chosen = chosen.model_copy(update={"arrivals": arrivals})
        slo_list = [c for text in slos for c in parse_conditions(text, option="--slo", op="<")]
        fail_list = parse_conditions(fail_on or "", option="--fail-on", op=">")
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    token = token or os.environ.get(TOKEN_ENV)
    event_name = event_name if event_name is not None else _event_name(profile)
    if not event_name.strip() or len(event_name) > 200:
        raise click.BadParameter("must be 1 to 200 characters", param_hint="--event")
    options = _Options(
        data,
        seed,
        slo_list,
        fail_list,
        max_in_flight,
        timeout_s,
        output,
        json_path,
        apply_suggestions,
        token,
        event_name,
    )
    own = model is not None and url is None and is_model_file(model)
    try:
        if own:
            assert model is not None
            from sordino.models.repository import model_from_spec

            name = model_from_spec(model).name
            with own_server(model, server_config) as own_url:
                status = _run(own_url, name, chosen, options)
        else:
            if model is not None and is_model_file(model):
                raise Failure(f"--model {model} is a file; with --url give the model's name")
            status = _run(server_url(url), model, chosen, options)
    except (Failure, ConfigError, ReportFailure) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    if status:
        sys.exit(status)


def _event_name(profile: str) -> str:
    """The event a run of ``--profile`` is marked as: a file's stem, else the name as written."""
    from sordino.loadtest.profiles import builtin_name

    return profile if builtin_name(profile) is not None else Path(profile).stem


@dataclass(frozen=True, slots=True)
class _Options:
    data: Path | None
    seed: int
    slos: list[Condition]
    fail_on: list[Condition]
    max_in_flight: int
    timeout_s: float
    output: Path | None
    json_path: Path | None
    apply_to: Path | None
    token: str | None
    event: str


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i == 0 else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]


def _mark(url: str, o: _Options, edge: str, journal: Path | None) -> Path | None:
    """Mark the ``edge`` of the run's event in the server's journal; return its path.

    The start finds the journal (None, and a note saying why, when the server does not
    name one this machine can open); the end marks the same one.
    """
    import sqlite3
    import time

    from sordino.loadtest.server_metrics import journal_file
    from sordino.telemetry.journal import write_mark

    if edge == "start":
        path, why = journal_file(url, o.token)
        if path is None or not Path(path).is_file():
            why = why or f"its journal {path} is not on this machine"
            click.echo(f"note: the run is not marked as event {o.event!r}: {why}", err=True)
            return None
        journal = Path(path)
    if journal is None:
        return None
    try:
        write_mark(journal, o.event, edge, t=time.time(), cause="sordino stress-test")
    except (sqlite3.Error, OSError) as exc:
        click.echo(f"note: the {edge} of event {o.event!r} was not marked: {exc}", err=True)
        return None
    if edge == "end":
        click.echo(f"marked the run as event {o.event!r} in {journal}", err=True)
    return journal


def _run(url: str, model: str | None, profile: Profile, o: _Options) -> int:
    """Run, report, and return the exit status: 0, FAILED_CONDITION when a --fail-on
    condition held, else CLIENT_ERRORS when most answers were client errors."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )  # fmt: skip

    from sordino.loadtest import findings as find
    from sordino.loadtest.report import HEADLINE_HEADER, draw_charts, headline_rows, render_html
    from sordino.loadtest.run import Unreachable, execute, prepare

    try:
        plan = prepare(url, model, profile, data=o.data, seed=o.seed)
    except Unreachable as exc:
        raise Failure(str(exc)) from None
    console = Console(stderr=True)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    journal = _mark(url, o, "start", None)
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task("starting", total=profile.duration)

        def live(p: LiveProgress) -> None:
            rate = p.sent / p.elapsed_s if p.elapsed_s > 0 else 0.0
            bar.update(
                task,
                completed=min(p.elapsed_s, p.duration_s),
                description=(
                    f"sent {p.sent} ({rate:.0f}/s) ok {p.answered - p.errors} "
                    f"err {p.errors} inflight {p.in_flight}"
                ),
            )

        result = execute(
            plan,
            max_in_flight=o.max_in_flight,
            timeout_s=o.timeout_s,
            slos=o.slos,
            fail_on=o.fail_on,
            progress=live,
            token=o.token,
        )
    _mark(url, o, "end", journal)
    warnings = find.client_warnings(result)
    found = find.findings(result)
    suggested = find.suggestions(result)
    # With --json - the JSON owns standard output; what people read goes to standard error.
    human = o.json_path is not None and str(o.json_path) == "-"
    for line in _table([HEADLINE_HEADER, *headline_rows(result)]):
        click.echo(line, err=human)
    for warning in warnings:
        click.echo(f"warning: client bottleneck: {warning}", err=True)
    for line in found[1:]:
        click.echo(f"- {line}", err=human)
    output, json_path, apply_to = o.output, o.json_path, o.apply_to
    if output is not None:
        html = render_html(result, found, warnings, suggested, draw_charts(result))
        write_output(output, html)
        click.echo(f"report written to {output}", err=human)
    if json_path is not None:
        document = result.to_json()
        document.update(
            findings=found,
            client_warnings=warnings,
            suggestions=[s.to_json() for s in suggested],
        )
        text = json.dumps(document, indent=1)
        if str(json_path) == "-":
            click.echo(text)
        else:
            write_output(json_path, text)
    if apply_to is not None:
        if suggested:
            find.apply_suggestions(apply_to, suggested)
            click.echo(f"{len(suggested)} suggestion(s) merged into {apply_to}", err=human)
        else:
            click.echo(f"no suggestions: {apply_to} left unchanged", err=human)
    tripped = [v for v in result.failures if v.met]
    for verdict in tripped:
        c = verdict.condition
        click.echo(
            f"fail-on: {c.text} held ({c.metric} {c.describe_value(verdict.measured)})", err=True
        )
    if tripped:
        return FAILED_CONDITION
    refused = find.mostly_client_errors(result)
    if refused is not None:
        click.echo(f"error: {refused}", err=True)
        return CLIENT_ERRORS
    return 0
