"""Checking a model's files against its checksums before it loads (Triton's ``checksum``
repository agent; what the configuration may say: :mod:`sordino.config.checksums`)."""

from __future__ import annotations

import hashlib

from sordino.config.checksums import split_key
from sordino.errors import ModelLoadError
from sordino.models.repository import ModelSource

__all__ = ["verify_checksums"]

_CHUNK = 1 << 20


def verify_checksums(source: ModelSource) -> None:
    """Raise :class:`ModelLoadError` unless each file ``source``'s checksums name (from
    its folder, :attr:`ModelSource.folder`) has its digest."""
    name, folder = source.name, source.folder
    inside = folder.resolve()
    for key, expected in source.config.checksums.items():
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
