"""Triton's response cache: answers of the models that enable it, by their inputs.

A model whose configuration says ``response_cache { enable: true }`` (``config.pbtxt``)
or ``response_cache: true`` (``config.yaml``) has its successful responses kept here
when the server has a cache (``--cache-config local,size=BYTES``, as Triton's ``local``
cache; config ``server.response_cache_size``). A request whose inputs — names,
datatypes, shapes and bytes — hash to those of a kept response, for the same model
version, is answered from it without running the model (its requested outputs and
classification are still applied to it, so a request asking for fewer outputs gets
what it asked for). The cache holds at most ``size`` bytes of outputs, the least
recently used leaving first; a response larger than the whole cache is not kept.

The key is a BLAKE2b digest (``hashlib``) of the model version and the inputs, as
Triton keys its cache by a hash of the same; the answer is the model's own, copied
out of the arena when it is kept (the arena's blocks go back at once), read-only.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from sordino.inference import ModelKey, Tensor
from sordino.memory.refs import Tensors
from sordino.records import CacheFigures

__all__ = ["ResponseCache", "warn_uncached"]

log = logging.getLogger("sordino")


def warn_uncached(what: str) -> None:
    """Say that ``what`` (a model or pipeline) enables response_cache on a server that
    has no cache, so every request runs it, as on Triton without ``--cache-config``."""
    log.warning(
        "%s enables response_cache, but the server has no response cache: every request "
        "runs it, as on Triton without --cache-config (start with --cache-config "
        "local,size=BYTES to keep answers)",
        what,
    )


_DIGEST_BYTES = 16
_ENTRY_OVERHEAD = 64 + _DIGEST_BYTES
"""Bytes an entry counts besides its outputs (its key and bookkeeping)."""


class ResponseCache:
    """Kept responses by the hash of their request's inputs, at most ``size`` bytes."""

    def __init__(self, size: int) -> None:
        self.size = size
        # Each answer: its read-only arrays, its size, its model, its parameters.
        self._entries: OrderedDict[
            bytes, tuple[dict[str, Tensor], int, ModelKey, dict[str, Any] | None]
        ] = OrderedDict()
        self._keys: dict[ModelKey, set[bytes]] = {}  # each model version's entries
        self._used = 0
        self._lookups = self._hits = self._evictions = 0
        self._lookup_s = self._insertion_s = 0.0

    @staticmethod
    def key(model: ModelKey, inputs: Mapping[str, Tensor]) -> bytes:
        """The digest of ``model`` and ``inputs`` (their names, datatypes, shapes and
        bytes, in name order). The model's generation is in it: a version reloaded
        never answers from what its previous load said."""
        digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
        digest.update(f"{model.name}\0{model.version}\0{model.generation}\0".encode())
        for name in sorted(inputs):
            array = np.asarray(inputs[name])
            digest.update(f"{name}\0{array.dtype.str}\0{array.shape}\0".encode())
            if array.dtype == object:  # BYTES: each element's length, then its bytes
                for item in array.ravel():
                    data = item if isinstance(item, bytes) else str(item).encode()
                    digest.update(len(data).to_bytes(8, "little"))
                    digest.update(data)
            else:
                digest.update(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
        return digest.digest()

    def holds(self, key: bytes) -> bool:
        """Whether an answer is kept under ``key`` (not a lookup: nothing counted)."""
        return key in self._entries

    def get(self, key: bytes) -> Tensors | None:
        """The answer kept under ``key`` (read-only arrays, and the parameters the model
        gave with them), a new owner of it for each hit; or None."""
        started = time.perf_counter()
        self._lookups += 1
        found = self._entries.get(key)
        answer = None
        if found is not None:
            self._hits += 1
            self._entries.move_to_end(key)
            answer = Tensors.of(found[0])
            answer.parameters = found[3]
        self._lookup_s += time.perf_counter() - started
        return answer

    def forget(self, model: ModelKey) -> None:
        """Drop every answer of ``model`` (it was unloaded)."""
        for key in self._keys.pop(model, ()):
            self._used -= self._entries.pop(key)[1]

    def put(self, model: ModelKey, key: bytes, outputs: Mapping[str, Tensor]) -> bool:
        """Keep a copy of ``outputs`` under ``key``, making room by letting the least
        recently used go; False (nothing kept) when they are larger than the cache."""
        started = time.perf_counter()
        nbytes = _ENTRY_OVERHEAD + sum(_nbytes(np.asarray(v)) for v in outputs.values())
        stored = nbytes <= self.size
        if stored:
            kept: dict[str, Tensor] = {}
            for name, value in outputs.items():
                array = np.array(value, copy=True)
                array.flags.writeable = False
                kept[name] = array
            if key in self._entries:
                self._drop(key)
            while self._used + nbytes > self.size:
                self._drop(next(iter(self._entries)))
                self._evictions += 1
            parameters = outputs.parameters if isinstance(outputs, Tensors) else None
            self._entries[key] = (kept, nbytes, model, parameters)
            self._keys.setdefault(model, set()).add(key)
            self._used += nbytes
        self._insertion_s += time.perf_counter() - started
        return stored

    def _drop(self, key: bytes) -> None:
        _, nbytes, model, _ = self._entries.pop(key)
        self._used -= nbytes
        keys = self._keys[model]
        keys.discard(key)
        if not keys:
            del self._keys[model]

    def statistics(self) -> CacheFigures:
        """The figures of the cache as a whole."""
        return CacheFigures(
            self.size,
            self._used,
            len(self._entries),
            self._lookups,
            self._hits,
            self._lookups - self._hits,
            self._evictions,
            self._lookup_s,
            self._insertion_s,
        )


def _nbytes(array: Any) -> int:
    if array.dtype == object:
        return int(sum(len(item) if isinstance(item, bytes) else 8 for item in array.ravel()))
    return int(array.nbytes)
