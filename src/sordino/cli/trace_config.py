"""``--trace-config``, as Triton spells it: where and which requests are traced.

Triton's ``--trace-config [<mode>,]<setting>=<value>`` sets one trace setting per use:
``triton,file=PATH`` and ``triton,log-frequency=N`` for its ``triton`` mode, and
``level=TIMESTAMPS`` (or ``OFF``), ``rate=N``, ``count=N`` and ``mode=triton`` for
every mode. They become ``server.trace`` (``config/trace.py``); the ``opentelemetry``
mode and ``level=TENSORS`` are refused as not supported.
"""

from __future__ import annotations

from typing import Any

import click

__all__ = ["trace_settings"]

_TRITON = {"file": "file", "log-frequency": "log_frequency"}
_GLOBAL = {"level": "level", "rate": "rate", "count": "count", "mode": "mode"}


def trace_settings(
    context: click.Context, parameter: click.Parameter, values: tuple[str, ...]
) -> dict[str, Any]:
    """The ``server.trace`` settings the ``--trace-config`` values give (by field)."""
    found: dict[str, Any] = {}

    def refuse(value: str, why: str) -> click.BadParameter:
        return click.BadParameter(f"{value!r}: {why}", context, parameter)

    for value in values:
        mode, _, setting = value.rpartition(",")
        key, equals, given = setting.partition("=")
        key, given = key.strip(), given.strip()
        if not equals or not given:
            raise refuse(value, "give [triton,]SETTING=VALUE, as triton,file=/tmp/trace.json")
        if mode.strip() == "opentelemetry" or (key == "mode" and given != "triton"):
            raise refuse(value, "only Triton's triton trace mode is supported")
        names = _TRITON if mode.strip() == "triton" else _GLOBAL
        if mode.strip() not in ("", "triton") or key not in names:
            raise refuse(
                value,
                "the settings are triton,file=PATH, triton,log-frequency=N, "
                "level=TIMESTAMPS|OFF, rate=N, count=N and mode=triton",
            )
        field = names[key]
        if field == "level":
            if given == "TENSORS":
                raise refuse(value, "trace level TENSORS is not supported; give TIMESTAMPS")
            found.setdefault("level", []).append(given)
        else:
            found[field] = given
    return found
