"""The signals that stop ``sordino start``, and a terminal or pipe that goes away.

SIGINT (Ctrl-C), SIGTERM (a service manager, ``kill``) and SIGHUP (the terminal or SSH
session the server runs in goes away) each start the graceful stop. SIGHUP's default
would end the process on the spot: the requests in flight lost, and the arena's
segment left in ``/dev/shm`` (its pages reserved, so memory gone until a reboot; the
resource tracker that would remove it shares the terminal and dies with it). A server
started under ``nohup`` has SIGHUP ignored: it stays ignored.

After a hang-up the terminal is gone and every write to it fails (``EIO``): the
standard streams that were that terminal are pointed at ``/dev/null``, so the stop's
lines and log are dropped rather than failing the stop. A stream redirected to a file
or a pipe is kept — until a write finds its reader gone: the server's and its workers'
``sys.stdout`` and ``sys.stderr`` then point themselves at ``/dev/null``
(``execution/lost_streams.py``).
"""

from __future__ import annotations

import contextlib
import os
import signal

from sordino.execution.lost_streams import point_at_null

WORDS = {signal.SIGINT: "interrupted", signal.SIGTERM: "terminated", signal.SIGHUP: "hung up"}
"""The line ``sordino start`` prints when a signal ends its start-up."""


def stop_signals() -> tuple[signal.Signals, ...]:
    """The signals to stop on: SIGINT, SIGTERM, and SIGHUP unless it is ignored (nohup)."""
    signals = [signal.SIGINT, signal.SIGTERM]
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signals.append(signal.SIGHUP)
    return tuple(signals)


def terminal_streams() -> tuple[int, ...]:
    """The standard streams that are a terminal now (asked before any hang-up: a
    hung-up terminal no longer answers as one)."""
    return tuple(fd for fd in (0, 1, 2) if _isatty(fd))


def leave_lost_terminal(streams: tuple[int, ...]) -> None:
    """Point ``streams`` (:func:`terminal_streams`) at ``/dev/null`` (after SIGHUP)."""
    point_at_null(streams)


def _isatty(fd: int) -> bool:
    with contextlib.suppress(OSError):
        return os.isatty(fd)
    return False
