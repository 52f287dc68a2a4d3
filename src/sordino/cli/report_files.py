"""What the report commands (``diagnose``, ``postmortem``) share: the ``--output`` option,
its check, the journal opened with a clear message, and the failure they print."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from sordino.telemetry.journal_reader import JournalReader

__all__ = ["ReportFailure", "check_output", "open_journal", "output_option"]


class ReportFailure(Exception):
    """A clear message for the person running the command (printed as ``error: …``)."""


output_option = click.option(
    "--output",
    type=click.Path(path_type=Path, dir_okay=False),
    required=True,
    help="The report: .html or .pdf.",
)
"""``--output``: the report file, .html or .pdf (required)."""


def check_output(output: Path) -> str:
    """The report's suffix (``.html``, ``.htm`` or ``.pdf``); any other is a usage error."""
    suffix = output.suffix.lower()
    if suffix not in (".html", ".htm", ".pdf"):
        raise click.BadParameter(
            f"must end in .html or .pdf, not {output.name!r}", param_hint="--output"
        )
    return suffix


def open_journal(path: Path) -> JournalReader:
    """The journal at ``path``; a missing or unreadable one is a :class:`ReportFailure`."""
    from sordino.telemetry.journal_reader import JournalReader, MissingJournal

    try:
        return JournalReader(path)
    except MissingJournal as exc:
        raise ReportFailure(str(exc)) from None
