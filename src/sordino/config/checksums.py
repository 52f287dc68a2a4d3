"""A model's file checksums, as Triton's ``checksum`` repository agent takes them.

A ``config.pbtxt`` may say::

    model_repository_agents { agents [ { name: "checksum",
        parameters { key: "MD5:1/model.onnx" value: "d726e132f91f16ebee703d96f6f73cb1" } } ] }

Each key is an algorithm and a file's path relative to the model's folder, each value
the file's expected digest in hex. Triton's agent (``checksum_repository_agent``) checks
them every time the model loads and fails the load on a mismatch; so does sordino
(:func:`sordino.models.checksums.verify_checksums`, called by the loader). The only
algorithm Triton's agent has is MD5, and so it is here. What a key may say is checked
when the configuration is read (:func:`check_checksums`); a path that leaves the
model's folder is refused (Triton's agent would read it).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePosixPath

from sordino.config.base import HashedDict

__all__ = ["ALGORITHMS", "check_checksums", "split_key"]

ALGORITHMS = {"md5": 32}
"""The digests a checksum may use (lower case) and the length of one in hex."""
_HEX = re.compile(r"^[0-9a-fA-F]+$")


def split_key(key: str) -> tuple[str, str]:
    """``MD5:1/model.onnx`` → (``md5``, ``1/model.onnx``)."""
    algorithm, _, path = key.partition(":")
    return algorithm.lower(), path


def check_checksums(checksums: Mapping[str, str]) -> HashedDict[str, str]:
    """``checksums`` if each key names a digest sordino has and a file inside the model's
    folder, and each value is such a digest in hex; ValueError naming what to fix."""
    for key, value in checksums.items():
        algorithm, path = split_key(key)
        if not path:
            raise ValueError(
                f"checksum key {key!r} is not ALGORITHM:PATH (for example "
                "'MD5:1/model.onnx', the path from the model's folder)"
            )
        if algorithm not in ALGORITHMS:
            raise ValueError(
                f"checksum {key!r}: the algorithm {key.partition(':')[0]!r} is not supported; "
                f"use {', '.join(a.upper() for a in ALGORITHMS)} (as Triton's checksum agent)"
            )
        parts = PurePosixPath(path).parts
        if path.startswith(("/", "\\")) or ".." in parts or "\\" in path:
            raise ValueError(
                f"checksum {key!r}: the path must lie inside the model's folder, written "
                "from it with '/' (for example '1/model.onnx')"
            )
        size = ALGORITHMS[algorithm]
        if not isinstance(value, str) or len(value) != size or not _HEX.match(value):
            raise ValueError(
                f"checksum {key!r}: {value!r} is not an {algorithm.upper()} digest "
                f"({size} hexadecimal digits)"
            )
    return HashedDict(checksums)
