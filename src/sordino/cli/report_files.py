"""What the report commands (``diagnose``, ``postmortem``, ``stress``) share: the
``--output`` option, its check, the journal opened with a clear message, the report
written (or a clear failure: a read-only place, a full disk), and the failure they
print."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from sordino.telemetry.journal_reader import JournalReader

__all__ = [
    "ReportFailure",
    "check_output",
    "open_journal",
    "output_option",
    "write_output",
    "write_report",
]


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


@contextlib.contextmanager
def open_journal(path: Path) -> Iterator[JournalReader]:
    """The journal at ``path``, closed after the block; a missing one, and one that
    cannot be read (another database, damaged pages the block's reads find), is a
    :class:`ReportFailure`."""
    from sordino.telemetry.journal_reader import JournalReader, MissingJournal

    try:
        with JournalReader(path) as reader:
            yield reader
    except MissingJournal as exc:
        raise ReportFailure(str(exc)) from None


def write_output(path: Path, content: str | bytes) -> None:
    """Write a file the user named (its folder made); one that cannot be written — a
    read-only place, a full disk — is a :class:`ReportFailure` that says which and
    what to do, and a file this write began is not left behind half written."""
    data = content.encode("utf-8") if isinstance(content, str) else content
    existed = path.exists()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ReportFailure(
            f"cannot write {path}: a file stands where its folder would be; give another path"
        ) from None
    except OSError:
        pass  # said below, as the write fails the same way
    try:
        path.write_bytes(data)
    except OSError as exc:
        if not existed and path.is_file():  # only what this write began (never a device)
            with contextlib.suppress(OSError):
                path.unlink()
        raise ReportFailure(
            f"cannot write {path} ({exc.strerror or exc}): give another path, or free "
            "room on its disk"
        ) from None


def write_report(path: Path, html: Callable[[], str], pdf: Callable[[io.BytesIO], None]) -> None:
    """Write the report ``--output`` names: ``html()`` for .html, else the PDF ``pdf``
    draws whole in memory (matplotlib writing to a full disk itself fails with a
    ``zlib`` error), each as :func:`write_output` does."""
    if path.suffix.lower() != ".pdf":
        write_output(path, html())
        return
    buffer = io.BytesIO()
    pdf(buffer)
    write_output(path, buffer.getvalue())
