"""Checking a model's files against its checksums before it loads (Triton's ``checksum``
repository agent; what the configuration may say: :mod:`sordino.config.checksums`)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from sordino.config.checksums import split_key
from sordino.config.models import ModelConfig
from sordino.errors import ModelLoadError

__all__ = ["model_folder", "verify_checksums"]

_CHUNK = 1 << 20


def model_folder(config: ModelConfig, file: Path) -> Path:
    """The folder a model's checksum paths start from: its repository folder (or the
    folder its ``path`` names), else the folder of its model file."""
    path = config.path
    if path is not None and path.is_dir():
        return path
    return (path or file).parent


def verify_checksums(name: str, config: ModelConfig, file: Path) -> None:
    """Raise :class:`ModelLoadError` unless each file ``config.checksums`` names has its
    digest (``file``: the version's model file, for a model without a folder)."""
    if not config.checksums:
        return
    folder = model_folder(config, file)
    inside = folder.resolve()
    for key, expected in config.checksums.items():
        algorithm, relative = split_key(key)
        target = folder / relative
        if not target.resolve().is_relative_to(inside):
            raise ModelLoadError(
                f"model {name!r}: checksum {key!r} names a file that leads outside the model's "
                f"folder {folder}; checksums are of the model's own files"
            )
        digest = hashlib.new(algorithm, usedforsecurity=False)
        try:
            with target.open("rb") as stream:
                while chunk := stream.read(_CHUNK):
                    digest.update(chunk)
        except OSError as exc:
            raise ModelLoadError(
                f"model {name!r}: checksum {key!r}: cannot read {target}: "
                f"{exc.strerror or exc}; fix the path (from {folder}) or add the file"
            ) from None
        got = digest.hexdigest()
        if got != expected.lower():
            raise ModelLoadError(
                f"model {name!r}: the {algorithm.upper()} checksum of {relative} is {got}, but "
                f"its configuration expects {expected}: the file is not the one the checksum "
                "was made of (replace the file, or update the checksum)"
            )
