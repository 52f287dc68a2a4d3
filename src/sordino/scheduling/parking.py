"""Parking: which of the scheduler's tensors defragmentation may move, and when.

A parked :class:`~sordino.memory.refs.Tensors` is one nobody reads until it is unparked
(see ``memory/refs.py``): while every holder of an arena block is parked, the memory
manager may move the block and repoint the arrays. The scheduler parks what waits in
its queue — a work item's inputs, the request's own inputs, a stream's carried state,
an iterative request's next step — and unparks a work item's inputs when it leaves the
queue (taken into a batch, dropped or cancelled), so the blocks of running batches and
of responses being written never move. Inputs on the heap (a plain mapping of arrays)
have nothing to park.
"""

from __future__ import annotations

from collections.abc import Mapping

from sordino.inference import Tensor, release_owned
from sordino.memory.refs import Tensors
from sordino.scheduling.work import WorkItem

__all__ = ["park", "park_first_step", "release_unrun", "unpark"]


def park(inputs: Mapping[str, Tensor]) -> None:
    """Park ``inputs`` when they are arena tensors (queued: they may move)."""
    if isinstance(inputs, Tensors):
        inputs.park()


def unpark(inputs: Mapping[str, Tensor]) -> None:
    """Pin ``inputs`` again when they are arena tensors (about to be read, or given back)."""
    if isinstance(inputs, Tensors):
        inputs.unpark()


def park_first_step(item: WorkItem, tensors: Tensors) -> None:
    """A request was accepted: give its first step ``item`` a hold of its own on
    ``tensors`` (the request keeps its own) and park both while they wait."""
    # The step's own hold (the request keeps its own); heap tensors need none.
    item.inputs = tensors.share() if tensors.leases else tensors
    # Queued work and the request's own inputs are read only when the step runs:
    # until then defragmentation may move their arena blocks.
    park(item.inputs)
    tensors.park()


def release_unrun(inputs: Mapping[str, Tensor]) -> None:
    """A queued step's ``inputs`` that will never run: pin them and give them back."""
    unpark(inputs)
    release_owned(inputs)
