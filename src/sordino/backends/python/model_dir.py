"""``pb_utils.get_model_dir()``: the folder of the model's ``model.py`` (its version
folder), as Triton's Python backend gives it to a model.

Triton runs each model instance in a process of its own, so there the folder is the
process's; sordino may run several Python models in one process (thread instances), so
the folder is the one of the model whose code asks (its ``initialize``, ``execute`` or
``finalize``: :func:`sordino.backends.python.bls.current`), or of the only model the
process has (code run while ``model.py`` is imported, a thread the model started).
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path
from types import ModuleType

from sordino.backends.python import bls
from sordino.backends.python.raised import models_own, raised
from sordino.backends.python.triton_errors import TritonModelException
from sordino.errors import ModelLoadError

__all__ = ["forget_model", "get_model_dir", "import_model", "set_model_dir"]

_DIRS: dict[str, str] = {}
_LOCK = threading.Lock()


def set_model_dir(model: str, folder: str) -> None:
    """Note that ``model``'s ``model.py`` is in ``folder`` (before it is imported)."""
    with _LOCK:
        _DIRS[model] = folder


def get_model_dir() -> str:
    """The folder of the asking model's ``model.py``."""
    state = bls.current()
    with _LOCK:
        if state is not None and state.model in _DIRS:
            return _DIRS[state.model]
        if len(_DIRS) == 1:
            return next(iter(_DIRS.values()))
        known = ", ".join(sorted(_DIRS)) or "none"
    raise TritonModelException(
        "get_model_dir(): this process runs several Python models and cannot tell which "
        f"asks from here ({known}); call it from initialize or execute"
    )


def import_model(key: str, model: str, path: Path, where: str) -> ModuleType:
    """Import ``model``'s ``model.py`` at ``path``; its folder is then the model's
    (:func:`get_model_dir`) and first on ``sys.path``, so that it may import the files
    beside it. The module is named as Triton names it, ``<version>.<file>`` (``1.model``),
    with the folder above the version folders on ``sys.path`` too: a function of it then
    pickles by a name that the processes a model starts (a spawn or forkserver pool)
    import again. Where that name is taken already (several Python models in the
    server's own process, ``isolation: thread``), the module is ``key``."""
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    name = key
    if path.parent.name.isdigit() and f"{path.parent.name}.{path.stem}" not in sys.modules:
        name = f"{path.parent.name}.{path.stem}"
        # Right after the version folder: ahead of any other model's folder that is on
        # sys.path already (one of the server's own process, isolation: thread, passed
        # on to the forkserver), whose "1" would otherwise be found first.
        models = str(path.parent.parent)
        if models in sys.path:
            sys.path.remove(models)
        sys.path.insert(sys.path.index(folder) + 1, models)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelLoadError(f"{where}: cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    set_model_dir(model, folder)
    sys.modules[name] = module  # before it runs, as an import does: pickle looks it up
    try:
        spec.loader.exec_module(module)
    except BaseException as exc:  # sys.exit() at the top of model.py included
        del sys.modules[name]
        if not models_own(exc):
            raise
        hint = _install_hint(exc) if isinstance(exc, ModuleNotFoundError) else ""
        told = raised(exc, path.parent.parent if path.parent.name.isdigit() else path.parent)
        raise ModelLoadError(f"{where}: importing {path} raised {told}{hint}") from exc
    return module


def forget_model(module: ModuleType | None) -> None:
    """Once its model unloads, take ``module`` (:func:`import_model`'s) out of
    ``sys.modules``: in the server's own process (``isolation: thread``) the name is
    then free for the next model that loads, and the module goes with its last user."""
    if module is not None and sys.modules.get(module.__name__) is module:
        del sys.modules[module.__name__]


def _install_hint(exc: ModuleNotFoundError) -> str:
    """What to do about a package the model imports and the worker's Python lacks."""
    if not exc.name:
        return ""
    package = exc.name.partition(".")[0]
    return (
        f"; install {package!r} into the Python environment sordino runs from "
        f"({sys.executable} -m pip install …), or name a packed environment that has it "
        "with the model's EXECUTION_ENV_PATH parameter"
    )
