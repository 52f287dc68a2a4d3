"""How an exception a model's own code raised is told: what it was, and where.

``repr`` alone drops what a user needs most: an ``OSError``'s file name
(``FileNotFoundError(2, 'No such file or directory')``, but which file?) and the line
of ``model.py`` that raised it. Triton's Python backend ends such a message with an
``At:`` list of frames; sordino names the deepest frame in the model's own folder
(``model.py`` or a module beside it), which is the line to fix.
"""

from __future__ import annotations

import os
import signal
import threading
import traceback

__all__ = ["models_own", "raised"]


def models_own(exc: BaseException) -> bool:
    """Whether ``exc``, out of a model's code, is the model's failure, answered as the
    call's error, rather than the process's to stop on: every ``Exception``, and the
    ``KeyboardInterrupt``, ``SystemExit`` (``sys.exit()``) or ``GeneratorExit`` a model
    raised, which Triton's stub answers as it answers any other. (Left to stop the
    process: a ``KeyboardInterrupt`` that may be the user's Ctrl-C — in the main thread
    of a process that takes SIGINT. A worker ignores SIGINT; a model run in the server's
    threads never runs in its main thread.)"""
    if isinstance(exc, KeyboardInterrupt):
        return (
            threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        )
    return isinstance(exc, Exception | SystemExit | GeneratorExit)


def raised(exc: BaseException, folder: str | os.PathLike[str]) -> str:
    """``exc`` as ``Type(message)``, with the deepest of its frames in ``folder``:
    ``FileNotFoundError("[Errno 2] No such file or directory: 'w.bin'") at model.py:7
    in initialize``."""
    if isinstance(exc, OSError) and exc.filename is not None:
        told = f"{type(exc).__name__}({str(exc)!r})"
    else:
        told = repr(exc)
    root = os.path.realpath(folder) + os.sep
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        path = os.path.realpath(frame.filename)
        if path.startswith(root):
            return f"{told} at {path[len(root) :]}:{frame.lineno} in {frame.name}"
    return told
