"""Triton's ``EXECUTION_ENV_PATH``: a Python model's own packed environment.

A Triton Python model may ship the packages it imports as a ``conda-pack`` archive and
name it in its ``config.pbtxt``::

    parameters: {
      key: "EXECUTION_ENV_PATH",
      value: {string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}
    }

Triton unpacks it and runs the model's stub in it. sordino runs the model in its own
worker process, on the worker's interpreter, with the environment's ``site-packages``
first on that process's ``sys.path`` (its ``.pth`` files read): the model imports the
environment's packages before sordino's. As on Triton, the environment must be for the
interpreter's Python version (``lib/python3.X/site-packages``); what it cannot change
is refused, saying so:

- ``$$TRITON_MODEL_DIRECTORY`` stands for the model's folder; a relative path is taken
  from there too;
- an archive (``.tar.gz``, ``.tgz``, ``.tar``) is unpacked once into
  ``$TMPDIR/sordino-python-env-<digest of path, time, size>`` and shared by the
  model's workers (each unpacks into a folder of its own and renames it into place:
  the first one there wins); a folder is used as it is;
- the model must run in a worker process of its own (``isolation: process``, the
  default): a thread instance would change the server's own ``sys.path``;
- a package the worker has already imported (numpy, sordino's own) stays the worker's:
  the environment adds packages, it does not replace those; native libraries the
  environment's packages load are found as the packages find them (``LD_LIBRARY_PATH``
  is not changed, as it cannot be once the process runs).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import site
import stat
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from sordino.errors import ModelLoadError

__all__ = ["activate", "execution_environment"]

PARAMETER = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY = "$$TRITON_MODEL_DIRECTORY"


def execution_environment(
    config: dict[str, Any], folder: Path, where: str, *, own_process: bool
) -> Path | None:
    """The ``site-packages`` folder of the model's ``EXECUTION_ENV_PATH`` (unpacked
    where it is an archive), None without one; ModelLoadError saying what to fix."""
    given = config.get("parameters", {}).get(PARAMETER)
    value = given.get("string_value") if isinstance(given, dict) else None
    if not value:
        return None
    named = f"{where}: the parameter {PARAMETER} ({value})"
    if not own_process:
        raise ModelLoadError(
            f"{named} needs the model in a worker process of its own, where its packages "
            "can go first on sys.path (not in the server's process): remove isolation: "
            "thread, or the parameter"
        )
    path = Path(value.replace(MODEL_DIRECTORY, str(folder)))
    if not path.is_absolute():
        path = folder / path
    if path.is_dir():
        root = path
    elif path.is_file():
        root = _unpacked(path, named)
    else:
        raise ModelLoadError(f"{named}: there is no file or folder {path}")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    packages = root / "lib" / version / "site-packages"
    if not packages.is_dir():
        found = sorted(p.name for p in (root / "lib").glob("python3*")) if root.is_dir() else []
        has = f"it has lib/{', lib/'.join(found)}" if found else "it has no lib/python3.X"
        raise ModelLoadError(
            f"{named}: the environment is not for this server's Python ({version}: no "
            f"lib/{version}/site-packages; {has}); pack it with Python "
            f"{sys.version_info.major}.{sys.version_info.minor}, as Triton needs the "
            "stub's version"
        )
    return packages


def _unpacked(archive: Path, named: str) -> Path:
    """``archive`` unpacked in the temporary folder (once: a later load reuses it)."""
    facts = archive.stat()
    digest = hashlib.sha256(
        f"{archive.resolve()}:{facts.st_mtime_ns}:{facts.st_size}".encode()
    ).hexdigest()[:16]
    target = Path(tempfile.gettempdir()) / f"sordino-python-env-{digest}"
    if _ours(target):
        return target
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}-", dir=target.parent))
    try:
        with tarfile.open(archive) as packed:
            packed.extractall(staging, filter="data")
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(staging, ignore_errors=True)
        raise ModelLoadError(f"{named}: cannot unpack {archive}: {exc}") from None
    try:
        os.rename(staging, target)
    except OSError:  # another worker of the model unpacked it first: theirs is used
        if not _ours(target):  # or someone else put a folder there: ours is used
            return staging
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _ours(folder: Path) -> bool:
    """Whether ``folder`` is a folder this user unpacked (as ``mkdtemp`` makes them: ours,
    and nobody else may write in it): the temporary folder is shared with every user of
    the machine, and the code in the folder is imported into the model's worker."""
    try:
        found = folder.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(found.st_mode) and found.st_uid == os.getuid() and not found.st_mode & 0o077


def activate(packages: Path) -> None:
    """Put ``packages`` (and what its ``.pth`` files add) first on ``sys.path``."""
    before = list(sys.path)
    with contextlib.redirect_stdout(sys.stderr):  # a .pth file may print
        site.addsitedir(str(packages))
    added = [entry for entry in sys.path if entry not in before]
    sys.path[:] = added + before
