"""The errors of ``triton_python_backend_utils`` (:class:`TritonError`,
:class:`TritonModelException`), importable from it as in Triton's Python backend.
"""

from __future__ import annotations

__all__ = ["TritonError", "TritonModelException"]


class TritonError:
    """An error to put in an :class:`InferenceResponse`."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r})"


class TritonModelException(Exception):
    """Raised by the utilities when a model uses them wrongly."""

    def message(self) -> str:
        return str(self)
