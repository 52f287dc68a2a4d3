"""Triton's system shared-memory extension: client regions, inputs read from them, outputs
written into them.

A client on the same host creates a POSIX shared-memory object (``shm_open``, as
``tritonclient.utils.shared_memory`` does), registers it under a name with a key, an
offset and a byte size, and then names the region (with a byte size and an offset
within it) instead of sending an input's bytes, or to receive an output. Regions belong
to the tenant that registered them (the request's tenant, as the inference service
computes it): a request can name only its own tenant's regions, status lists only
them, and unregistering touches only them.

Every bound is checked with an error saying what to fix: the object must exist and hold
``offset + byte_size`` bytes at registration; an input's or output's ``offset +
byte_size`` must lie within its region; an input's byte size must be its tensor's; an
output's must hold the result. sordino's own arena segments cannot be registered.

An input is read as a read-only view on the mapping (no copy until the batch is staged
into the arena); unregistering a region drops the server's reference, and the mapping
goes away when the last request reading it is done.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from sordino.datatypes import serialize_bytes_tensor, tensor_from_binary
from sordino.errors import InvalidRequest, NotFound, TensorError
from sordino.inference import InferRequest, InferResponse
from sordino.protocol.codec import shared_memory_parameters
from sordino.server.service import request_tenant

__all__ = ["SHM_DIR", "SystemSharedMemory", "metadata_tenant"]

SHM_DIR = "/dev/shm"
"""Where POSIX shared-memory objects live on Linux."""

MAX_REGIONS = 256
"""The most regions one tenant may have registered at a time."""

MAX_REGIONS_TOTAL = 1024
"""The most regions registered at a time over every tenant (each holds a mapping)."""

_OWN_PREFIXES = ("sordino-", "psm_")
"""Names of sordino's own arena segments (named, and Python's unnamed ones)."""


@dataclass(frozen=True, slots=True)
class Region:
    """One registered region: where it lies and the bytes the server may touch."""

    name: str
    key: str
    offset: int
    byte_size: int
    view: np.ndarray[Any, np.dtype[np.uint8]]

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }


class SystemSharedMemory:
    """Registered system shared-memory regions, per tenant."""

    def __init__(self) -> None:
        self._regions: dict[str, dict[str, Region]] = {}
        self._lock = threading.Lock()

    # -- registration ------------------------------------------------------------------

    def register(self, tenant: str, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of object ``key`` as region ``name``."""
        if not name:
            raise InvalidRequest("the region name is empty; name the region to register")
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise InvalidRequest(
                    f"shared memory region {name!r}: {field} is {value!r}; it must be a "
                    "non-negative byte count"
                )
        if byte_size == 0:
            raise InvalidRequest(
                f"shared memory region {name!r}: byte_size is 0; register at least one byte"
            )
        path = _object_path(name, key)
        with self._lock:
            regions = self._regions.get(tenant, {})
            if name in regions:
                raise InvalidRequest(
                    f"shared memory region '{name}' already in manager (sordino: unregister "
                    "it first, or register under another name)"
                )
            if sum(len(r) for r in self._regions.values()) >= MAX_REGIONS_TOTAL:
                raise InvalidRequest(
                    f"the server has {MAX_REGIONS_TOTAL} shared memory regions registered, "
                    "the most allowed; unregister regions no longer used"
                )
            if len(regions) >= MAX_REGIONS:
                raise InvalidRequest(
                    f"tenant {tenant!r} has {MAX_REGIONS} shared memory regions registered, "
                    "the most allowed; unregister one first"
                )
            view = _map(name, key, path, offset, byte_size)
            region = Region(name, key, offset, byte_size, view)
            self._regions.setdefault(tenant, {})[name] = region

    def unregister(self, tenant: str, name: str | None = None) -> None:
        """Forget region ``name`` (every region of the tenant when None); unknown is no error."""
        with self._lock:
            regions = self._regions.get(tenant, {})
            if name is None:
                regions.clear()
            else:
                regions.pop(name, None)
            if not regions:
                self._regions.pop(tenant, None)

    def status(self, tenant: str, name: str | None = None) -> list[dict[str, Any]]:
        """The tenant's regions (or the one named), as Triton's status lists them."""
        with self._lock:
            regions = dict(self._regions.get(tenant, {}))
        if name is None:
            return [regions[key].status() for key in sorted(regions)]
        region = regions.get(name)
        if region is None:
            raise NotFound(
                f"Unable to find system shared memory region: '{name}' (sordino: it is not "
                "registered for this tenant)"
            )
        return [region.status()]

    def count(self) -> int:
        """Regions registered, over every tenant."""
        with self._lock:
            return sum(len(regions) for regions in self._regions.values())

    # -- inference ---------------------------------------------------------------------

    @staticmethod
    def uses(request: InferRequest) -> bool:
        """True when ``request`` reads an input from, or writes an output to, a region."""
        if request.shared_inputs:
            return True
        return any("shared_memory_region" in out.parameters for out in request.outputs or ())

    def attach(self, request: InferRequest, tenant: str) -> None:
        """Read ``request``'s shared-memory inputs from ``tenant``'s regions into its inputs.

        Also checks that every output to be written into a region names one of the
        tenant's regions with room for its bytes' bounds (the size is checked once the
        output is known). Raises before anything is queued.
        """
        if request.outputs:
            for output in request.outputs:
                where = shared_memory_parameters(f"output {output.name!r}", output.parameters)
                if where is not None:
                    self._slice(tenant, where[0], where[2], where[1], f"output {output.name!r}")
        if not request.shared_inputs:
            return
        inputs = dict(request.inputs)
        for shared in request.shared_inputs:
            owner = f"input {shared.name!r}"
            data = self._slice(tenant, shared.region, shared.offset, shared.byte_size, owner)
            try:
                inputs[shared.name] = tensor_from_binary(
                    shared.name, shared.datatype, shared.shape, memoryview(data.data).toreadonly()
                )
            except TensorError as exc:
                raise TensorError(
                    f"{exc.message} (the input lies in shared memory region "
                    f"{shared.region!r}: its shared_memory_byte_size must be the tensor's size)"
                ) from None
        request.inputs = inputs
        request.shared_inputs = []

    def write_outputs(self, request: InferRequest, response: InferResponse, tenant: str) -> None:
        """Write each output the request wants in shared memory into its region."""
        if not request.outputs:
            return
        for output in request.outputs:
            where = shared_memory_parameters(f"output {output.name!r}", output.parameters)
            if where is None:
                continue
            region, size, offset = where
            array = response.outputs.get(output.name)
            if array is None:
                continue  # the encoder reports the missing output
            if array.dtype == np.object_:
                payload = np.frombuffer(serialize_bytes_tensor(array), dtype=np.uint8)
            else:
                little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
                payload = little.reshape(-1).view(np.uint8)
            if payload.size > size:
                raise InvalidRequest(
                    f"shared memory size specified with the request for output "
                    f"'{output.name}' should be at least {payload.size} bytes to hold the "
                    f"results (sordino: shared_memory_byte_size is {size})"
                )
            target = self._slice(tenant, region, offset, size, f"output {output.name!r}")
            target[: payload.size] = payload

    def _slice(
        self, tenant: str, name: str, offset: int, size: int, owner: str
    ) -> np.ndarray[Any, np.dtype[np.uint8]]:
        with self._lock:
            region = self._regions.get(tenant, {}).get(name)
        if region is None:
            raise NotFound(
                f"Unable to find shared memory region: '{name}' (sordino: {owner} names a "
                "region this tenant has not registered; register it with POST "
                f"/v2/systemsharedmemory/region/{name}/register)"
            )
        if offset + size > region.byte_size:
            raise InvalidRequest(
                f"Invalid offset + byte size for shared memory region: '{name}' (sordino: "
                f"{owner} asks for {size} bytes at offset {offset} but the region holds "
                f"{region.byte_size} bytes)"
            )
        return region.view[offset : offset + size]


def metadata_tenant(headers: Mapping[str, str]) -> str:
    """The tenant of a registration call, from its headers (HTTP) or metadata (gRPC).

    Computed as the inference service computes a request's tenant, so a region
    registered by a tenant is the one its inference requests find.
    """
    tenant = headers.get("x-sordino-tenant")
    probe = InferRequest(
        model="", inputs={}, headers={"x-sordino-tenant": tenant} if tenant else {}
    )
    return request_tenant(probe)


def _object_path(name: str, key: str) -> str:
    if not isinstance(key, str) or not key.strip("/"):
        raise InvalidRequest(
            f"shared memory region {name!r}: the key is {key!r}; give the shm_open name of "
            "the object, such as '/my_region'"
        )
    base = key.lstrip("/")
    if "/" in base or base in {".", ".."} or "\0" in base:
        raise InvalidRequest(
            f"shared memory region {name!r}: the key {key!r} is not a shared memory object "
            "name; give a name such as '/my_region' (one leading slash, no other)"
        )
    if base.startswith(_OWN_PREFIXES):
        raise InvalidRequest(
            f"shared memory region {name!r}: the key {key!r} is reserved for sordino's own "
            "segments; create the object under another name"
        )
    return os.path.join(SHM_DIR, base)


def _map(
    name: str, key: str, path: str, offset: int, byte_size: int
) -> np.ndarray[Any, np.dtype[np.uint8]]:
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
    except FileNotFoundError:
        raise InvalidRequest(
            f"Unable to open shared memory region: '{key}' (sordino: no shared memory object "
            f"{key!r} exists; create it before registering region {name!r})"
        ) from None
    except OSError as exc:
        raise InvalidRequest(
            f"Unable to open shared memory region: '{key}' (sordino: {exc.strerror})"
        ) from None
    try:
        size = os.fstat(fd).st_size
        if offset + byte_size > size:
            raise InvalidRequest(
                f"Invalid offset + byte size for shared memory region: '{name}' (sordino: "
                f"offset {offset} + byte_size {byte_size} is past the end of object {key!r}, "
                f"which holds {size} bytes)"
            )
        mapping = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    # The view keeps the mapping alive while any request still reads it.
    whole = np.frombuffer(mapping, dtype=np.uint8)
    return whole[offset : offset + byte_size]
