"""Triton's model loading API in a Python model: ``pb_utils.load_model``,
``unload_model`` and ``is_model_ready``.

A Python model may load, unload and ask about other models of the server that runs it
(Triton's Python backend since 23.07, "Model Loading API"). Each function here is a
:class:`~sordino.backends.calls.ModelCall` with ``control`` set, carried as a BLS call
is (:mod:`sordino.backends.python.bls`: over the worker's pipe, or onto the server's
loop for a thread instance) and answered by the server's model control
(``server/model_calls.py``), so the rules of the load and unload endpoints apply:
``explicit`` model control only, names are names, a load's ``config`` and ``file:``
files as over HTTP (``server/model_uploads.py``).

As on Triton:

- each call blocks until the server answers; a failure raises
  ``TritonModelException`` with the server's message;
- ``unload_model`` returns once the model no longer serves, without waiting for its
  requests to drain (so a model may unload itself, or a model whose request it is
  executing);
- the API works in ``initialize`` and ``execute``, not in ``auto_complete_config`` or
  ``finalize``.

What sordino adds: a model's ``initialize`` may load other models while that model is
itself being loaded through the load API (Triton's documentation asks that such a model
not be loaded at start-up; sordino refuses the API while the server is starting, saying
so).
"""

from __future__ import annotations

import queue
from collections.abc import Mapping
from typing import Any

from sordino.backends.calls import CallAnswer, ModelCall
from sordino.backends.python import bls
from sordino.backends.python.triton_errors import TritonModelException

__all__ = ["is_model_ready", "load_model", "unload_model"]

_REFUSED_IN = ("auto_complete_config", "finalize")


def load_model(model_name: str, config: str = "", files: Mapping[str, bytes] | None = None) -> None:
    """Load or reload ``model_name``; ``config`` (JSON text) replaces its configuration,
    ``files`` (``{"file:1/model.onnx": bytes}``, with ``config``) make its folder."""
    parameters: dict[str, Any] = {}
    if config:
        parameters["config"] = _text(config, "config")
    if files:
        if not isinstance(files, Mapping):
            raise TritonModelException(
                f"load_model files must be a dict of path to bytes, not {files!r}"
            )
        checked = {}
        for path, content in files.items():
            if not isinstance(path, str) or not isinstance(content, (bytes, bytearray)):
                raise TritonModelException(
                    "load_model files must map each 'file:<version>/<name>' path (str) to "
                    f"the file's content (bytes); got {type(path).__name__} -> "
                    f"{type(content).__name__}"
                )
            checked[path] = bytes(content)
        parameters["files"] = checked
    _ask("load", model_name, parameters=parameters)


def unload_model(model_name: str, unload_dependents: bool = False) -> None:
    """Unload every version of ``model_name`` (an ensemble's models too with
    ``unload_dependents``); returns once it no longer serves."""
    _ask("unload", model_name, parameters={"unload_dependents": bool(unload_dependents)})


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    """Whether ``model_name`` (version ``model_version``, else any) serves now."""
    answer = _ask("ready", model_name, version=_text(model_version, "model_version"))
    return bool(answer.parameters.get("ready", False))


def _ask(
    action: str, model: str, *, version: str = "", parameters: Mapping[str, Any] | None = None
) -> CallAnswer:
    """Send one control call and wait for its answer; raise on an error."""
    state = bls.current()
    phase = "execute" if state is None else state.phase
    if phase in _REFUSED_IN:
        raise TritonModelException(
            f"the model loading API is not supported in {phase} (as on Triton)"
        )
    call = ModelCall(
        model=_text(model, "model_name"),
        inputs={},
        version=version,
        parameters=dict(parameters or {}),
        caller=state.model if state is not None else "",
        control=action,
    )
    answers: queue.SimpleQueue[CallAnswer] = queue.SimpleQueue()
    bls.start_call(call, answers.put)
    answer = answers.get()
    while not answer.final:
        answer = answers.get()
    if answer.error:
        raise TritonModelException(answer.error)
    return answer


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    raise TritonModelException(f"{what} must be a string, not {value!r}")
