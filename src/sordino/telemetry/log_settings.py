"""The logging extension's settings of one process (Triton's ``log_info``, ``log_warning``,
``log_error``, ``log_verbose_level``, ``log_format``, ``log_file``).

The server's are read and changed over ``/v2/logging`` and the ``LogSettings`` RPC
(``server/log_settings.py``); a model's worker process starts with the server's and is
told of each change (``execution/worker.py``), so a Python model's ``pb_utils.Logger``
lines follow them as they follow Triton's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from sordino.errors import InvalidRequest, Unsupported

__all__ = ["LogSettings", "configure_process_log", "process_log_settings"]

_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
"""The line ``sordino start`` writes (its ``logging.basicConfig``)."""
FORMATS = {"default": None, "ISO8601": "%Y-%m-%dT%H:%M:%SZ"}
"""Triton's log formats, and the time format each gives a line (None: logging's own)."""
_SWITCHES = {"log_info": logging.INFO, "log_warning": logging.WARNING, "log_error": logging.ERROR}


class LogSettings:
    """The logging extension's settings over one logger (the root logger: the whole
    process) and the handlers it writes through."""

    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._logger = logger if logger is not None else logging.getLogger()
        level = self._logger.getEffectiveLevel()
        self._on = {name: level <= at for name, at in _SWITCHES.items()}
        self._verbose = 1 if level <= logging.DEBUG else 0
        self._format = "default"
        self._filter = _Severities(self._on)

    def current(self) -> dict[str, Any]:
        """The settings, as Triton's ``GET /v2/logging`` answers them."""
        return {
            "log_file": "",
            **self._on,
            "log_verbose_level": self._verbose,
            "log_format": self._format,
        }

    def update(self, changes: Mapping[str, Any]) -> dict[str, Any]:
        """Apply ``changes`` (all checked before any is applied); return the settings."""
        known = {"log_file", *_SWITCHES, "log_verbose_level", "log_format"}
        unknown = sorted(set(changes) - known)
        if unknown:
            raise InvalidRequest(
                f"unknown log setting {', '.join(map(repr, unknown))}; the settings are "
                f"{', '.join(sorted(known))}"
            )
        if "log_file" in changes:
            raise Unsupported(
                "log_file cannot be changed over the network (as on Triton): the log goes "
                "where sordino start sends it (standard error)"
            )
        for name in _SWITCHES:
            if name in changes and not isinstance(changes[name], bool):
                raise InvalidRequest(f"{name} must be true or false, not {changes[name]!r}")
        verbose = changes.get("log_verbose_level", self._verbose)
        if isinstance(verbose, bool) or not isinstance(verbose, int) or verbose < 0:
            raise InvalidRequest(f"log_verbose_level must be a whole number ≥ 0, not {verbose!r}")
        shape = changes.get("log_format", self._format)
        if shape not in FORMATS:
            raise InvalidRequest(f"log_format must be {' or '.join(FORMATS)}, not {shape!r}")
        self._on.update({name: changes[name] for name in _SWITCHES if name in changes})
        self._verbose, self._format = verbose, shape
        self._apply()
        return self.current()

    def _apply(self) -> None:
        self._logger.setLevel(logging.DEBUG if self._verbose else logging.INFO)
        formatter = logging.Formatter(_FORMAT, datefmt=FORMATS[self._format])
        if self._format == "ISO8601":
            formatter.converter = time.gmtime
        for handler in self._logger.handlers:
            if self._filter not in handler.filters:
                handler.addFilter(self._filter)
            handler.setFormatter(formatter)


class _Severities(logging.Filter):
    """Drops the records of the severities switched off (debug ones pass the logger's
    level only while verbose)."""

    def __init__(self, on: dict[str, bool]) -> None:
        super().__init__()
        self._on = on

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return self._on["log_error"]
        if record.levelno >= logging.WARNING:
            return self._on["log_warning"]
        if record.levelno >= logging.INFO:
            return self._on["log_info"]
        return True


_PROCESS: LogSettings | None = None


def process_log_settings() -> LogSettings:
    """The settings of this process's log (one per process: logging is process-wide),
    made the first time they are asked for."""
    global _PROCESS
    if _PROCESS is None:
        _PROCESS = LogSettings()
    return _PROCESS


def configure_process_log(settings: Mapping[str, Any]) -> None:
    """Log as a server whose settings are ``settings`` (``LogSettings.current()``): a
    worker process, which Python leaves with no handler and only warnings shown."""
    logging.basicConfig(
        level=logging.DEBUG if settings.get("log_verbose_level") else logging.INFO,
        format=_FORMAT,
    )
    process_log_settings().update({k: v for k, v in settings.items() if k != "log_file"})
