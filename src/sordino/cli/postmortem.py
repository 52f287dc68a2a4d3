"""``sordino postmortem``: a retrospective of a named period, from the journal alone.

It reads only the journal file under ``--data-dir`` (read-only), so it works on a
copy of the directory taken after the server is gone.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from sordino.cli.report_files import (
    ReportFailure,
    check_output,
    open_journal,
    output_option,
    write_report,
)

if TYPE_CHECKING:
    from sordino.reports.postmortem import Postmortem, Targets
    from sordino.reports.render import Chart

__all__ = ["postmortem"]


def _sections(text: str) -> tuple[str, ...]:
    from sordino.reports.postmortem import SECTIONS

    if text.strip() == "all":
        return SECTIONS
    chosen = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [s for s in chosen if s not in SECTIONS]
    if unknown or not chosen:
        raise click.BadParameter(
            f"{', '.join(unknown) or text!r}: use all, or a comma-separated list of "
            f"{', '.join(SECTIONS)}",
            param_hint="--metrics",
        )
    return chosen


def _percent(value: str, option: str) -> float:
    try:
        number = float(value.rstrip("%"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a percentage", param_hint=option) from None
    if not 0 < number <= 100:
        raise click.BadParameter("must lie in (0, 100]", param_hint=option)
    return number / 100


@click.command()
@click.option("--event", "name", default=None, help="The period's name (see `sordino event mark`).")
@click.option("--from", "start", default=None, help='Start, "2026-11-27 08:00" (local time).')
@click.option("--to", "end", default=None, help="End, in the same form.")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("~/.sordino"),
    show_default=True,
    help="The server's data directory, or a copy of it.",
)
@click.option("--journal-file", default="journal.sqlite3", show_default=True)
@click.option(
    "--metrics",
    default="all",
    show_default=True,
    help="all, or some of availability,latency,guardian,interventions,resources,repair,windows.",
)
@click.option("--availability-target", default="99.9%", show_default=True)
@click.option("--slo-target", default="99%", show_default=True, help="Share within the SLO.")
@output_option
def postmortem(
    name: str | None,
    start: str | None,
    end: str | None,
    data_dir: Path,
    journal_file: str,
    metrics: str,
    availability_target: str,
    slo_target: str,
    output: Path,
) -> None:
    """Report on a period: targets vs actuals, availability, guardian actions, causes.

    The period is --from..--to, or the one `sordino event mark NAME` named (--event
    without --from/--to); --to defaults to the end mark, else the journal's end.
    """
    check_output(output)
    if name is None and start is None:
        raise click.UsageError("give --event NAME (a marked period) or --from TIME")
    sections = _sections(metrics)
    # Imported here, so that the other commands start without the report code.
    from sordino.reports.postmortem import Targets
    from sordino.reports.postmortem_render import draw_postmortem_charts

    targets = Targets(
        availability=_percent(availability_target, "--availability-target"),
        slo_attainment=_percent(slo_target, "--slo-target"),
    )
    path = data_dir.expanduser() / journal_file
    try:
        report = _build(path, name, start, end, targets, sections)
        charts = draw_postmortem_charts(report)
        _write(report, charts, output)
    except ReportFailure as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(f"postmortem of {report.name} written to {output}")
    for row in report.targets:
        click.echo(f"  {row.what}: {row.actual} (target {row.target}) {row.verdict}")
    click.echo(
        f"  {len(report.guardian)} guardian action(s), {len(report.interventions)} "
        "manual intervention(s)"
    )


def _build(
    path: Path,
    name: str | None,
    start: str | None,
    end: str | None,
    targets: Targets,
    sections: tuple[str, ...],
) -> Postmortem:
    from sordino.reports.postmortem import find_marks, parse_moment, postmortem

    with open_journal(path) as reader:
        span = reader.span()
        if span is None:
            raise ReportFailure(f"the journal at {path} is empty")
        try:
            t0 = parse_moment(start) if start else None
            t1 = parse_moment(end) if end else None
        except ValueError as exc:
            raise ReportFailure(str(exc)) from None
        if name is not None and (t0 is None or t1 is None):
            marked = reader.window(0, span[1] + 86400).events
            mark_start, mark_end = find_marks(marked, name)
            if t0 is None:
                if mark_start is None:
                    raise ReportFailure(
                        f"the journal at {path} has no start mark for {name!r}: give --from, "
                        f"or mark it with `sordino event mark {name} --start`"
                    )
                t0 = mark_start
            if t1 is None and mark_end is not None:
                t1 = mark_end + 0.001  # the end mark itself belongs to the period
        assert t0 is not None
        t1 = t1 if t1 is not None else span[1] + 1
        if t1 <= t0:
            raise ReportFailure("the period ends before it starts")
        window = reader.window(t0, t1)
        earlier = reader.latest_events("model_loaded", t0, limit=50)
        later = reader.window(t1, t1 + 60).events
    if not window.series and not window.events:
        raise ReportFailure(f"the journal at {path} holds nothing in that period")
    return postmortem(
        window,
        name=name or "period",
        source=str(path),
        targets=targets,
        sections=sections,
        earlier_events=earlier,
        later_events=later,
    )


def _write(report: Postmortem, chosen: list[Chart], output: Path) -> None:
    from sordino.reports.postmortem_render import render_postmortem_html, render_postmortem_pdf

    write_report(
        output,
        lambda: render_postmortem_html(report, chosen),
        lambda target: render_postmortem_pdf(report, chosen, target),
    )
