"""What every configuration section shares: the strict frozen base and common checks.

Every section forbids unknown keys (a typo must fail loudly, not fall back to a
default) and is frozen: a :class:`~sordino.config.RuntimeConfig` is an immutable value
that can be shared between tasks and compared with a newer one on hot
reconfiguration. Lists in the file become tuples for the same reason.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict

__all__ = ["ExpandedPath", "Section", "reject_repeated_names"]

ExpandedPath = Annotated[Path, AfterValidator(lambda path: path.expanduser())]
"""A path whose leading "~" is expanded."""


class Section(BaseModel):
    """Base of every configuration section: unknown keys are errors, values are frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


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
