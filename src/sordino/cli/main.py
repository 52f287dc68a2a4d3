"""The ``sordino`` command: one group, one module per subcommand."""

from __future__ import annotations

import click

from sordino import __version__
from sordino.cli.chaos import chaos
from sordino.cli.diagnose import diagnose
from sordino.cli.models import models
from sordino.cli.monitor import monitor
from sordino.cli.profile import profile
from sordino.cli.start import start

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sordino")
def cli() -> None:
    """sordino: an inference runtime for AIGC services (KServe v2 over HTTP and gRPC)."""


cli.add_command(start)
cli.add_command(models)
cli.add_command(monitor)
cli.add_command(profile)
cli.add_command(diagnose)
cli.add_command(chaos)


def main() -> None:
    """Console-script entry point."""
    cli()
