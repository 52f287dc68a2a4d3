"""A load request's parameters, and the folders of models loaded from uploaded files.

Triton's load API (``POST /v2/repository/models/NAME/load``, gRPC
``RepositoryModelLoad``, a Python model's ``pb_utils.load_model``) takes two kinds of
parameter, read here by :func:`load_parameters`:

- ``config``: the model's configuration as JSON text, used instead of the folder's;
- ``file:<path>``: the bytes of one file of the model's folder (``file:1/model.onnx``,
  ``file:1/model.py``), base64 text over HTTP, bytes over gRPC. The files given make
  the whole folder the model loads from — the repository's folder for that name, if
  it has one, is not read — and ``config`` must come with them (Triton's rule).

:class:`Uploads` writes each load's files into a temporary folder of its own,
``<tmp>/sordino-upload-XXXX/NAME/``, and removes it once the model is unloaded or
loaded from elsewhere, and when the server stops. A path that is absolute, climbs
out (``..``) or names no file is refused before anything is written.

Files sent this way are run by the server as the model's code (a Python model's
``model.py``), exactly as a file put in the repository would be: the load endpoints
are protected ones (``control/admin.py``), and only ``explicit`` model control takes
them.
"""

from __future__ import annotations

import base64
import binascii
import logging
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from sordino.errors import ConfigError, InvalidRequest, Unsupported

__all__ = ["FILE_PREFIX", "LoadRequest", "Uploads", "load_parameters", "read_config"]

log = logging.getLogger("sordino.control")

FILE_PREFIX = "file:"


@dataclass(frozen=True, slots=True)
class LoadRequest:
    """What a load asks for: a configuration (JSON text) and the model's files (by their
    path in the model's folder), each optional."""

    config: str | None = None
    files: Mapping[str, bytes] = field(default_factory=dict)


def load_parameters(parameters: Mapping[str, Any]) -> LoadRequest:
    """The load request that ``parameters`` make (Triton's ``config`` and ``file:``
    parameters); anything else is refused, saying what is taken."""
    config: str | None = None
    files: dict[str, bytes] = {}
    for name, value in parameters.items():
        if name == "config":
            if not isinstance(value, str):
                raise InvalidRequest(
                    "load parameter 'config' must be a string: the model configuration as "
                    "JSON text (json.dumps of it)"
                )
            config = value
        elif name.startswith(FILE_PREFIX):
            files[upload_path(name)] = _content(name, value)
        else:
            raise Unsupported(
                f"load parameter {name!r} is not supported: sordino takes 'config' (the "
                "model's configuration as JSON text) and 'file:<version>/<file>' (a file of "
                "the model's folder, base64); send the load without it"
            )
    if files and config is None:
        raise InvalidRequest(
            "a load with files (file:... parameters) needs the 'config' parameter too: the "
            "files make the model's whole folder, and config is its configuration (as on "
            "Triton)"
        )
    return LoadRequest(config, files)


def read_config(name: str, request: LoadRequest, in_repository: bool) -> dict[str, Any]:
    """``request``'s config for model ``name``, read (InvalidRequest saying what is wrong
    with it); one without files is for a model of the repository only."""
    from sordino.backends.pbtxt import parse_triton_json

    assert request.config is not None
    if not request.files and not in_repository:
        raise Unsupported(
            f"model {name!r} is not a model of the repository, so a load's config cannot "
            "replace its configuration (not supported): change its entry in sordino's "
            "configuration instead, load it without config, or send its files with the "
            "config (file: parameters)"
        )
    try:
        return parse_triton_json(request.config, source="the load request's config")
    except ConfigError as exc:
        raise InvalidRequest(str(exc)) from None


def upload_path(name: str) -> str:
    """The path in the model's folder that parameter ``name`` (``file:<path>``) names,
    checked: relative, inside the folder, naming a file."""
    text = name[len(FILE_PREFIX) :]
    path = PurePosixPath(text)
    bad = (
        not text
        or "\\" in text
        or "\x00" in text
        or path.is_absolute()
        or any(part in ("", ".", "..") for part in text.split("/"))
    )
    if bad:
        shown = name if len(name) <= 80 else name[:77] + "…"
        raise InvalidRequest(
            f"load parameter {shown!r} does not name a file inside the model's folder: give "
            "a relative path such as 'file:1/model.onnx' (no leading '/', no '..', no "
            "empty part)"
        )
    return text


def _content(name: str, value: Any) -> bytes:
    """A file parameter's bytes: bytes as they are (gRPC), text as base64 (HTTP)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidRequest(
                f"load parameter {name!r} is not base64 text: send the file's bytes "
                "base64-encoded (tritonclient's load_model(files=...) does it)"
            ) from None
    raise InvalidRequest(
        f"load parameter {name!r} must be the file's bytes, base64-encoded as a string "
        f"(over gRPC: bytes_param), not {type(value).__name__}"
    )


class Uploads:
    """The temporary folders that models loaded from uploaded files are served from."""

    def __init__(self) -> None:
        self._roots: dict[str, Path] = {}

    def root(self, name: str) -> Path | None:
        """The folder holding model ``name``'s uploaded folder (None: not uploaded)."""
        return self._roots.get(name)

    def write(self, name: str, files: Mapping[str, bytes]) -> Path:
        """Write ``files`` as model ``name``'s folder in a new temporary folder; return
        that folder (the model's is ``<it>/name``). The model's root is not changed."""
        root = Path(tempfile.mkdtemp(prefix="sordino-upload-"))
        try:
            folder = root / name
            for relative, content in files.items():
                path = folder / relative
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(content)
        except OSError as exc:
            shutil.rmtree(root, ignore_errors=True)
            raise InvalidRequest(f"model {name!r}: cannot write its files: {exc}") from None
        return root

    def use(self, name: str, root: Path | None) -> Path | None:
        """Serve ``name`` from ``root`` from now on (None: from the repository); return
        the root it had."""
        before = self._roots.pop(name, None)
        if root is not None:
            self._roots[name] = root
        return before

    def close(self) -> None:
        """Remove every uploaded folder (the server stops)."""
        roots, self._roots = list(self._roots.values()), {}
        for root in roots:
            discard(root)


def discard(root: Path | None) -> None:
    """Remove an uploaded folder no model is served from any longer."""
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)
        log.debug("removed the uploaded model folder %s", root)
