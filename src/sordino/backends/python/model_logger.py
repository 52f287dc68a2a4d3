"""``triton_python_backend_utils.Logger``: a Python model's log lines, in the worker's log."""

from __future__ import annotations

import logging
from typing import ClassVar

__all__ = ["Logger"]


class Logger:
    """Log lines of the model, in the worker's log (logger ``sordino.python_model``)."""

    INFO, WARNING, ERROR, VERBOSE = 0, 1, 2, 3
    _log = logging.getLogger("sordino.python_model")
    _LEVELS: ClassVar[dict[int, int]] = {
        0: logging.INFO,
        1: logging.WARNING,
        2: logging.ERROR,
        3: logging.DEBUG,
    }

    @classmethod
    def log(cls, message: str, level: int = 0) -> None:
        cls._log.log(cls._LEVELS.get(level, logging.INFO), "%s", message)

    @classmethod
    def log_info(cls, message: str) -> None:
        cls.log(message, cls.INFO)

    @classmethod
    def log_warn(cls, message: str) -> None:
        cls.log(message, cls.WARNING)

    @classmethod
    def log_error(cls, message: str) -> None:
        cls.log(message, cls.ERROR)

    @classmethod
    def log_verbose(cls, message: str) -> None:
        cls.log(message, cls.VERBOSE)
