"""The ``sordino`` console script and ``python -m sordino``: the command, Ctrl-C made quiet.

Nothing is imported at this module's top beyond :mod:`sys`, so that a Ctrl-C at any
moment, the command's own imports included, ends it with one line (``interrupted``) and
the status a shell gives a process ended by SIGINT (130), never with a traceback.
"""

from __future__ import annotations

import sys

__all__ = ["main"]

INTERRUPTED = 130  # 128 + SIGINT


def main() -> None:
    """Run ``sordino`` with the process's arguments; Ctrl-C exits 130 with one line."""
    try:
        from sordino.cli.main import main as run

        run()
    except KeyboardInterrupt:
        try:
            sys.stderr.write("interrupted\n")
            sys.stderr.flush()
        finally:
            sys.exit(INTERRUPTED)
