"""The frames of a model's calls to other models (Triton's BLS; see ``execution/messages.py``).

The worker sends :class:`ModelCallStart` (and :class:`ModelCallCancel` to give a call
up); the server answers with :class:`ModelCallAnswer` frames, the last one final.
"""

from __future__ import annotations

from dataclasses import dataclass

from sordino.backends.calls import CallAnswer, ModelCall

__all__ = ["ModelCallAnswer", "ModelCallCancel", "ModelCallStart"]


@dataclass(frozen=True, slots=True)
class ModelCallStart:
    """The model asks the server for an inference on another model (BLS): ``call``.

    ``call_id`` is the worker's own numbering; the answers name it.
    """

    call_id: int
    call: ModelCall


@dataclass(frozen=True, slots=True)
class ModelCallCancel:
    """The model gave call ``call_id`` up: the server cancels it (a final answer follows)."""

    call_id: int


@dataclass(frozen=True, slots=True)
class ModelCallAnswer:
    """An answer to the worker's model call ``call_id``; ``answer.final`` ends the call."""

    call_id: int
    answer: CallAnswer
