"""What every configuration section shares: the strict frozen base and common checks.

Every section forbids unknown keys (a typo must fail loudly, not fall back to a
default) and is frozen: a :class:`~sordino.config.RuntimeConfig` is an immutable value
that can be shared between tasks and compared with a newer one on hot
reconfiguration. Lists in the file become tuples for the same reason.

A number field never takes ``true``/``false``: pydantic would read them as 1 and 0,
so ``max_batch_size: true`` would quietly mean a batch of one. Every number field
also has an upper bound (docs/configuration.md lists the ranges), so the same limits
hold for files, ``sordino reconfigure``, strategies and model hints alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, model_validator

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_POOL_SIZE",
    "MIN_POOL_SIZE",
    "ExpandedPath",
    "Section",
    "reject_repeated_names",
]

MAX_BATCH_SIZE = 65_536
"""The largest batch any setting may ask for (``max_batch_size``, ``max_batch``, hints)."""
MIN_POOL_SIZE = 64 * 1024
"""The smallest shared-memory arena (``memory.pool_size``, the ``memory_pool`` hint)."""
MAX_POOL_SIZE = 1024**4
"""The largest shared-memory arena (1 TiB)."""

ExpandedPath = Annotated[Path, AfterValidator(lambda path: path.expanduser())]
"""A path whose leading "~" is expanded."""


class Section(BaseModel):
    """Base of every configuration section: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        # A bool given for a number field is handed on as the word it was written as
        # ("true"), which the number's own validation refuses under the field's name.
        if not isinstance(data, Mapping):
            return data
        wrong = [
            key
            for key, value in data.items()
            if isinstance(value, bool)
            and key in cls.model_fields
            and _takes_numbers_not_bools(cls.model_fields[key].annotation)
        ]
        if not wrong:
            return data
        return {**data, **{key: str(data[key]).lower() for key in wrong}}


def _takes_numbers_not_bools(annotation: object) -> bool:
    leaves: list[object] = []
    pending = [annotation]
    while pending:
        current = pending.pop()
        origin = get_origin(current)
        if origin is Annotated:
            pending.append(get_args(current)[0])
        elif origin is Union or origin is UnionType:
            pending.extend(get_args(current))
        else:
            leaves.append(current)
    return bool not in leaves and str not in leaves and any(leaf in (int, float) for leaf in leaves)


def reject_repeated_names(
    names: Iterable[str], *, what: str, verb: str = "are used", hint: str = ""
) -> None:
    """Raise ValueError if a name occurs more than once in ``names``.

    The message lists every repeated name, sorted, in one shape:
    ``"<what> [<names>] <verb> more than once[; <hint>]"``, e.g.
    ``device names ['a'] are used more than once``.
    """
    seen: set[str] = set()
    repeated: set[str] = set()
    for name in names:
        (repeated if name in seen else seen).add(name)
    if repeated:
        message = f"{what} {sorted(repeated)} {verb} more than once"
        raise ValueError(f"{message}; {hint}" if hint else message)
