"""The ``sordino`` command: one group, one module per subcommand.

Each subcommand's module imports only click and the standard library at its top; what a
command needs to run (numpy, ONNX Runtime, the server, the report code) is imported
inside it, so ``sordino --help`` and ``sordino X --help`` answer at once
(tests/cli/test_imports.py). The console script is :func:`sordino.cli.entry.main`.
"""

from __future__ import annotations

import sys

import click

from sordino import __version__
from sordino.cli.chaos import chaos
from sordino.cli.diagnose import diagnose
from sordino.cli.event import event
from sordino.cli.events import events, guardian
from sordino.cli.generate import generate
from sordino.cli.group import Group
from sordino.cli.hints import hints
from sordino.cli.memory import memory
from sordino.cli.models import models
from sordino.cli.monitor import monitor
from sordino.cli.postmortem import postmortem
from sordino.cli.profile import profile
from sordino.cli.quantize import quantize
from sordino.cli.reconfigure import config, reconfigure
from sordino.cli.start import start
from sordino.cli.strategy import share_strategy, strategy
from sordino.cli.stress import stress_test
from sordino.cli.tenants import tenants
from sordino.cli.tune import tune

__all__ = ["cli", "main"]

# Modules whose pip package has another name.
_PACKAGES = {"sklearn": "scikit-learn", "yaml": "pyyaml", "pynvml": "nvidia-ml-py",
             "google": "protobuf", "PIL": "pillow", "hdrh": "hdrhistogram"}  # fmt: skip


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="sordino")
def cli() -> None:
    """sordino: an inference runtime for AIGC services (KServe v2 over HTTP and gRPC)."""


cli.add_command(start)
cli.add_command(models)
cli.add_command(monitor)
cli.add_command(profile)
cli.add_command(diagnose)
cli.add_command(chaos)
cli.add_command(memory)
cli.add_command(generate)
cli.add_command(stress_test)
cli.add_command(postmortem)
cli.add_command(event)
cli.add_command(events)
cli.add_command(guardian)
cli.add_command(tenants)
cli.add_command(reconfigure)
cli.add_command(config)
cli.add_command(strategy)
cli.add_command(share_strategy)
cli.add_command(hints)
cli.add_command(quantize)
cli.add_command(tune)


def main() -> None:
    """Console-script entry point.

    A module missing from the environment (a dependency uninstalled, or an optional
    one never installed) ends the command with one line naming what to install and
    exit status 1, never with a traceback.
    """
    try:
        cli()
    except ModuleNotFoundError as exc:
        module = (exc.name or "").partition(".")[0]
        if not module or module == "sordino":
            raise  # sordino's own code is missing: a broken installation, keep the trace
        package = _PACKAGES.get(module, module)
        click.echo(
            f"error: this command needs the Python package {package!r}, which is not "
            f"installed: pip install {package}",
            err=True,
        )
        sys.exit(1)
