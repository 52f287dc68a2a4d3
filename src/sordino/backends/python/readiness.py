"""A Python model's own readiness: Triton's optional ``TritonPythonModel.is_ready()``.

Triton's Python backend (from 2026-03, after Triton 2.51) calls a model's ``is_ready``,
when it has one, whenever the model's readiness is asked (``GET /v2/models/<m>/ready``,
gRPC ``ModelReady``, and the server's own readiness, which needs every model ready). It
must return a ``bool``, plain or from a coroutine (``async def is_ready``); anything
else, or an exception, makes the model not ready for that check. A model without it is
ready while its instances serve, and nothing is asked.

Here: the call in the model's process (:func:`model_readiness`). The executor asks each
instance on a thread that is not the batch's, so a busy model answers at once; at most
one check runs per instance, and one that does not answer within
:data:`~sordino.execution.instance_base.READY_CHECK_S` (Triton's five seconds) makes
that check "not ready" (``execution/instance_base.py``).
"""

from __future__ import annotations

import inspect
from typing import Any

from sordino.backends.python import bls
from sordino.backends.python.raised import models_own

__all__ = ["model_readiness"]


def model_readiness(model: Any, name: str) -> str | None:
    """Call ``model.is_ready()``: None when it says ready, else why the model is not."""
    if model is None:
        return "the model is not loaded"
    state = bls.Executing(name, phase="is_ready")
    try:
        with bls.executing(state):
            answer = model.is_ready()
            if inspect.iscoroutine(answer):  # async def is_ready, on the model's loop
                answer = bls.run_coroutine(answer, state)
    except BaseException as exc:
        if not models_own(exc):
            raise
        return f"is_ready() raised {type(exc).__name__}: {exc}"
    if not isinstance(answer, bool):  # Triton's own check (a bool, nothing like one)
        return f"is_ready() must return a boolean value, not {type(answer).__name__}"
    return None if answer else "is_ready() returned False"
