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

import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, TypeVar, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, field_validator, model_validator

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_NUMBER",
    "MAX_POOL_SIZE",
    "MIN_POOL_SIZE",
    "ExpandedPath",
    "HashedDict",
    "Section",
    "reject_repeated_names",
]

MAX_BATCH_SIZE = 65_536
"""The largest batch any setting may ask for (``max_batch_size``, ``max_batch``, hints)."""
MIN_POOL_SIZE = 64 * 1024
"""The smallest shared-memory arena (``memory.pool_size``, the ``memory_pool`` hint)."""
MAX_POOL_SIZE = 1024**4
"""The largest shared-memory arena (1 TiB)."""
MAX_NUMBER = float(2**53)
"""The ceiling of every number setting without a range of its own (about 9e15: the
largest integer a float and a JSON reader hold exactly; sizes stop at 1 PiB below it)."""

ExpandedPath = Annotated[Path, AfterValidator(lambda path: path.expanduser())]
"""A path whose leading "~" is expanded."""

_K = TypeVar("_K", int, str)
_V = TypeVar("_V")


class HashedDict(dict[_K, _V]):
    """A mapping field's value in a frozen section, which must hash (by its items in the
    order of their keys)."""

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(sorted(self.items(), key=lambda item: item[0])))


class Section(BaseModel):
    """Base of every configuration section: unknown keys are errors, values are frozen."""

    # protected_namespaces=(): Triton's own names (model_warmup, model_repository,
    # model_control_mode) are fields here; pydantic before 2.10 warned about each at
    # every start.
    model_config = ConfigDict(
        extra="forbid", frozen=True, use_attribute_docstrings=True, protected_namespaces=()
    )

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, data: Any) -> Any:
        # A bool given for a number field is handed on as the word it was written as
        # ("true"), which the number's own validation refuses under the field's name.
        if not isinstance(data, Mapping):
            return data
        fixed: dict[str, Any] = {}
        for key, value in data.items():
            if key not in cls.model_fields:
                continue
            annotation = cls.model_fields[key].annotation
            if isinstance(value, bool) and _takes_numbers_not_bools(annotation):
                fixed[key] = str(value).lower()
            elif isinstance(value, list | tuple) and any(isinstance(v, bool) for v in value):
                element = _element_of(annotation)
                if element is not None and _takes_numbers_not_bools(element):
                    fixed[key] = [str(v).lower() if isinstance(v, bool) else v for v in value]
        return {**data, **fixed} if fixed else data

    @field_validator("*", mode="after")
    @classmethod
    def _numbers_within_reach(cls, value: Any) -> Any:
        # The fields with a range of their own are checked by it; this is the ceiling of
        # those without (a count of 10**30 is a typo, and would overflow what uses it).
        for number in value if isinstance(value, tuple) else (value,):
            if isinstance(number, bool) or not isinstance(number, int | float):
                continue
            if not math.isfinite(number) or abs(number) > MAX_NUMBER:
                raise ValueError(
                    f"{number!r} is past the largest number a setting takes "
                    f"({MAX_NUMBER:.0e}); see docs/configuration.md for its range"
                )
        return value


def _leaves(annotation: object) -> list[object]:
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
    return leaves


def _takes_numbers_not_bools(annotation: object) -> bool:
    leaves = _leaves(annotation)
    return bool not in leaves and str not in leaves and any(leaf in (int, float) for leaf in leaves)


def _element_of(annotation: object) -> object | None:
    """The element type of a list or tuple field (``tuple[int, ...]``), else None."""
    for leaf in _leaves(annotation):
        origin = get_origin(leaf)
        if origin in (list, tuple) or (
            isinstance(origin, type) and issubclass(origin, Sequence) and origin is not str
        ):
            args: list[object] = [a for a in get_args(leaf) if a is not Ellipsis]
            if len(args) == 1:
                return args[0]
    return None


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
