"""``sordino event mark NAME --start|--end``: name a period in the journal.

The mark is written straight into the journal file under ``--data-dir`` (an
``event_mark`` event: subject NAME, payload ``edge`` start or end). That works
whether the server runs or not: SQLite lets a second process insert a row while the
server's writer runs (WAL mode; each waits up to 10 s for the other's transaction),
and it works on a server that has stopped. It needs the journal file, so run it on
the server's machine. ``sordino postmortem --event NAME`` then finds the period.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path

import click

from sordino.cli.group import Group

__all__ = ["event"]


@click.group(cls=Group)
def event() -> None:
    """Name periods of the journal (a sale, a launch, an incident)."""


@event.command()
@click.argument("name")
@click.option("--start", "edge", flag_value="start", help="The period starts now (or --at).")
@click.option("--end", "edge", flag_value="end", help="The period ends now (or --at).")
@click.option(
    "--data-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("~/.sordino"),
    show_default=True,
    help="The server's data directory.",
)
@click.option("--journal-file", default="journal.sqlite3", show_default=True)
@click.option("--at", default=None, help='When, if not now: "2026-11-27 08:00" (local time).')
@click.option("--note", default="", help="A line to keep with the mark.")
def mark(
    name: str,
    edge: str | None,
    data_dir: Path,
    journal_file: str,
    at: str | None,
    note: str,
) -> None:
    """Mark the start or the end of the period NAME in the journal."""
    # Imported here, so that the other commands start without the report code.
    from sordino.reports.postmortem import parse_moment
    from sordino.telemetry.journal import write_mark

    if edge is None:
        raise click.UsageError("give --start or --end")
    if not name.strip() or len(name) > 200:
        raise click.BadParameter("must be 1 to 200 characters", param_hint="NAME")
    t = time.time()
    if at is not None:
        try:
            t = parse_moment(at)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--at") from None
    path = data_dir.expanduser() / journal_file
    if not path.is_file():
        click.echo(
            f"error: no journal at {path}: give the --data-dir the server runs (or ran) with",
            err=True,
        )
        sys.exit(1)
    try:
        write_mark(path, name, edge, t=t, cause="sordino event mark", note=note)
    except sqlite3.Error as exc:
        click.echo(f"error: cannot write the mark into {path}: {exc}", err=True)
        sys.exit(1)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))
    click.echo(f"marked the {edge} of {name!r} at {stamp} in {path}")
