"""The frames of a decoupled model's batch (see ``execution/messages.py``).

The worker sends a :class:`Respond` per response, from any thread, at any time; the
server sends :class:`Cancel` when a request's client went away.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Cancel", "Respond"]


@dataclass(frozen=True, slots=True)
class Respond:
    """A decoupled model's response to request ``index`` of batch ``batch_id``.

    ``outputs`` are the response's tensors (none with a bare final flag), carried in the
    frame: the model sends from any thread, at any time, so there is no arena exchange
    to place them. ``final``: the request's last response. ``error``: the model answered
    the request with an error (Triton's error ``code``), as one response of its stream.
    """

    batch_id: int
    index: int
    final: bool
    outputs: dict[str, np.ndarray]
    error: str | None = None
    code: int = 1


@dataclass(frozen=True, slots=True)
class Cancel:
    """The client of request ``index`` of decoupled batch ``batch_id`` cancelled it."""

    batch_id: int
    index: int
