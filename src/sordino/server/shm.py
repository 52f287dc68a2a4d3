"""Triton's system shared-memory extension: client regions, inputs read from them, outputs
written into them.

A client on the same host creates a POSIX shared-memory object (``shm_open``, as
``tritonclient.utils.shared_memory`` does), registers it under a name with a key, an
offset and a byte size, and then names the region (with a byte size and an offset
within it) instead of sending an input's bytes, or to receive an output.

Who sees a region. With tenants configured (or ``auth.required``), regions belong to the
tenant the caller's API key names: a request can name only its own tenant's regions,
status lists only them, unregistering touches only them, and an object (the same file in
``/dev/shm``) registered by one tenant cannot be registered by another until the first
unregisters it. Without tenants there is one set of regions for every caller, as in
Triton: a claimed ``X-Sordino-Tenant`` is no credential and makes no separate set.

Every bound is checked with an error saying what to fix: the object must exist and hold
``offset + byte_size`` bytes at registration; an input's or output's ``offset +
byte_size`` must lie within its region; an input's byte size must be its tensor's; an
output's must hold the result. sordino's own arena segments cannot be registered.

The object can shrink after registration (its owner may ``ftruncate`` it), so the server
never maps it: touching a mapping past the object's end raises SIGBUS, which would end
the whole server. A region keeps the object's descriptor, and each use first checks the
object's current size (``fstat``) and then copies with ``pread``/``pwrite``, which end
short or fail instead of faulting if the object shrinks between the check and the copy.
An input is therefore copied once out of the region when the request is accepted (a
memcpy; the batch's staging copy follows as before); an output is written with one
``pwrite``. The descriptor is closed when the last request using the region is done.
"""

from __future__ import annotations

import os
import resource
import stat as stat_mode
import threading
import weakref
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from sordino.datatypes import (
    brief_repr,
    element_count,
    format_shape,
    serialize_bytes_tensor,
    tensor_from_binary,
    to_numpy_dtype,
)
from sordino.errors import InvalidRequest, NotFound, TensorError, Unsupported
from sordino.inference import InferRequest, InferResponse
from sordino.memory.segments import SHM_DIR
from sordino.protocol.extensions import shared_memory_parameters

__all__ = [
    "CUDA_REGISTER_REFUSAL",
    "SHM_DIR",
    "SystemSharedMemory",
    "cuda_register",
    "cuda_status",
]

"""Where POSIX shared-memory objects live on Linux."""

MAX_REGIONS = 256
"""The most regions one tenant may have registered at a time."""

MAX_REGIONS_TOTAL = 1024
"""The most regions registered at a time over every tenant (each holds a descriptor):
fewer where the open-file limit is low (a quarter of it), so regions never take the
descriptors connections need."""

SHARED = "default"
"""The one set of regions of a server without tenants."""

CUDA_REGISTER_REFUSAL = (
    "CUDA shared memory is not supported: this server has no CUDA devices (sordino "
    "serves no GPU memory to clients); use system shared memory or send tensors in the "
    "request"
)

_OWN_PREFIXES = ("sordino-", "psm_")
"""Names of sordino's own arena segments (named, and Python's unnamed ones)."""


def cuda_status(name: str | None) -> list[dict[str, Any]]:
    """Triton's answer to a CUDA shared-memory status on a server without GPUs: no
    regions (a named one is not found)."""
    if name:
        raise NotFound(f"Unable to find cuda shared memory region: {brief_repr(name)}")
    return []


def cuda_register(name: str) -> NoReturn:
    """Refuse a CUDA shared-memory registration: there are no CUDA devices."""
    raise Unsupported(f"{CUDA_REGISTER_REFUSAL} (region {brief_repr(name)})")


class Region:
    """One registered region: where it lies in its object, and the object's descriptor.

    The descriptor is closed when the region is no longer referenced (unregistered and
    no request still using it).
    """

    __slots__ = ("__weakref__", "byte_size", "fd", "identity", "key", "name", "offset")

    def __init__(
        self, name: str, key: str, offset: int, byte_size: int, fd: int, identity: tuple[int, int]
    ) -> None:
        self.name = name
        self.key = key
        self.offset = offset
        self.byte_size = byte_size
        self.fd = fd
        self.identity = identity
        weakref.finalize(self, os.close, fd)

    def status(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "key": self.key,
            "offset": self.offset,
            "byte_size": self.byte_size,
        }

    def read(self, offset: int, size: int, owner: str) -> np.ndarray[Any, np.dtype[np.uint8]]:
        """A copy of ``size`` bytes at ``offset`` within the region."""
        self._check_object(offset, size, owner)
        out = np.empty(size, dtype=np.uint8)
        view = out.data
        done = 0
        while done < size:
            try:
                got = os.preadv(self.fd, [view[done:]], self.offset + offset + done)
            except OSError as exc:
                raise self._failed(owner, exc.strerror) from None
            if got == 0:  # the object shrank after the check
                self._check_object(offset, size, owner)
                raise self._failed(owner, "the object ended before the bytes asked for")
            done += got
        return out

    def write(self, offset: int, payload: memoryview, owner: str) -> None:
        """Write ``payload`` at ``offset`` within the region."""
        self._check_object(offset, payload.nbytes, owner)
        data = payload.cast("B")
        done = 0
        while done < data.nbytes:
            try:
                done += os.pwrite(self.fd, data[done:], self.offset + offset + done)
            except OSError as exc:
                raise self._failed(owner, exc.strerror) from None

    def _check_object(self, offset: int, size: int, owner: str) -> None:
        try:
            actual = os.fstat(self.fd).st_size
        except OSError as exc:
            raise self._failed(owner, exc.strerror) from None
        if self.offset + offset + size > actual:
            raise InvalidRequest(
                f"shared memory region {brief_repr(self.name)} was registered with "
                f"{self.byte_size} bytes at offset {self.offset} of object "
                f"{brief_repr(self.key)}, but the object now holds {actual} bytes, so {owner} "
                f"({size} bytes at offset {offset} of the region) is past its end; give the "
                "object back its size, or unregister the region and register it again"
            )

    def _failed(self, owner: str, why: str | None) -> InvalidRequest:
        return InvalidRequest(
            f"shared memory region {brief_repr(self.name)} (object {brief_repr(self.key)}): "
            f"{owner} could not be copied: {why or 'unknown error'}"
        )


class SystemSharedMemory:
    """Registered system shared-memory regions, per tenant when tenants are configured."""

    def __init__(self, isolated: Callable[[], bool] | None = None) -> None:
        """``isolated()`` says whether tenants are configured (then each has its own
        regions); None means never."""
        self._isolated = isolated or (lambda: False)
        self._regions: dict[str, dict[str, Region]] = {}
        self._lock = threading.Lock()

    def _space(self, tenant: str) -> str:
        """The set of regions ``tenant`` sees: its own with tenants, else the one set."""
        return tenant if self._isolated() else SHARED

    # -- registration ------------------------------------------------------------------

    def register(self, tenant: str, name: str, key: str, offset: int, byte_size: int) -> None:
        """Open object ``key`` and register ``byte_size`` bytes at ``offset`` as ``name``."""
        if not name:
            raise InvalidRequest("the region name is empty; name the region to register")
        for field, value in (("offset", offset), ("byte_size", byte_size)):
            if type(value) is not int or value < 0:
                raise InvalidRequest(
                    f"shared memory region {brief_repr(name)}: {field} is {brief_repr(value)}; "
                    "it must be a non-negative byte count"
                )
        if byte_size == 0:
            raise InvalidRequest(
                f"shared memory region {brief_repr(name)}: byte_size is 0; register at least "
                "one byte"
            )
        path = _object_path(name, key)
        space = self._space(tenant)
        with self._lock:
            regions = self._regions.get(space, {})
            if name in regions:
                raise InvalidRequest(
                    f"shared memory region {brief_repr(name)} already in manager (sordino: "
                    "unregister it first, or register under another name)"
                )
            most = _most_regions()
            if sum(len(r) for r in self._regions.values()) >= most:
                raise InvalidRequest(
                    f"the server has {most} shared memory regions registered, "
                    "the most allowed; unregister regions no longer used"
                )
            if len(regions) >= MAX_REGIONS:
                raise InvalidRequest(
                    f"tenant {brief_repr(space)} has {MAX_REGIONS} shared memory regions "
                    "registered, the most allowed; unregister one first"
                )
            region = _open(name, key, path, offset, byte_size)
            for other, held in self._regions.items():
                if other != space and any(r.identity == region.identity for r in held.values()):
                    raise InvalidRequest(
                        f"shared memory object {brief_repr(key)} is already registered by another "
                        "tenant; a tenant can register only objects no other tenant holds "
                        "(create your own object under another name)"
                    )
            self._regions.setdefault(space, {})[name] = region

    def unregister(self, tenant: str, name: str | None = None) -> None:
        """Forget region ``name`` (every region when None) of the caller's set.

        An unknown name is no error, as in Triton; another tenant's region of that name
        is never touched.
        """
        space = self._space(tenant)
        with self._lock:
            regions = self._regions.get(space, {})
            if name is None:
                regions.clear()
            else:
                regions.pop(name, None)
            if not regions:
                self._regions.pop(space, None)

    def status(self, tenant: str, name: str | None = None) -> list[dict[str, Any]]:
        """The caller's regions (or the one named), as Triton's status lists them."""
        with self._lock:
            regions = dict(self._regions.get(self._space(tenant), {}))
        if name is None:
            return [regions[key].status() for key in sorted(regions)]
        region = regions.get(name)
        if region is None:
            raise NotFound(
                f"Unable to find system shared memory region: {brief_repr(name)} (sordino: it is "
                "not registered)"
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
        """Copy ``request``'s shared-memory inputs from the caller's regions into its inputs.

        Also checks that every output to be written into a region names one of the
        caller's regions with room for its bytes' bounds (the size is checked once the
        output is known). Raises before anything is queued.
        """
        if request.outputs:
            for output in request.outputs:
                where = shared_memory_parameters(f"output {output.name!r}", output.parameters)
                if where is not None:
                    self._region(tenant, where[0], where[2], where[1], _output(output.name))
        if not request.shared_inputs:
            return
        inputs = dict(request.inputs)
        for shared in request.shared_inputs:
            owner = f"input {brief_repr(shared.name)}"
            region = self._region(tenant, shared.region, shared.offset, shared.byte_size, owner)
            try:
                _check_size(shared.name, shared.datatype, shared.shape, shared.byte_size)
                data = region.read(shared.offset, shared.byte_size, owner)
                inputs[shared.name] = tensor_from_binary(
                    shared.name, shared.datatype, shared.shape, memoryview(data.data).toreadonly()
                )
            except TensorError as exc:
                raise TensorError(
                    f"{exc.message} (the input lies in shared memory region "
                    f"{brief_repr(shared.region)}: its shared_memory_byte_size must be the "
                    "tensor's size)"
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
            name, size, offset = where
            array = response.outputs.get(output.name)
            if array is None:
                continue  # not produced: left out, as the encoder leaves it
            if array.dtype == np.object_:
                payload = np.frombuffer(serialize_bytes_tensor(array), dtype=np.uint8)
            else:
                little = np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<"))
                payload = little.reshape(-1).view(np.uint8)
            if payload.size > size:
                raise InvalidRequest(
                    f"shared memory size specified with the request for output "
                    f"{brief_repr(output.name)} should be at least {payload.size} bytes to hold "
                    f"the results (sordino: shared_memory_byte_size is {size})"
                )
            owner = _output(output.name)
            region = self._region(tenant, name, offset, size, owner)
            region.write(offset, payload.data, owner)

    def _region(self, tenant: str, name: str, offset: int, size: int, owner: str) -> Region:
        """The caller's region ``name``, checked to hold ``size`` bytes at ``offset``."""
        with self._lock:
            region = self._regions.get(self._space(tenant), {}).get(name)
        if region is None:
            raise NotFound(
                f"Unable to find shared memory region: {brief_repr(name)} (sordino: {owner} names "
                "a region that is not registered; register it with POST "
                "/v2/systemsharedmemory/region/<name>/register)"
            )
        if offset + size > region.byte_size:
            raise InvalidRequest(
                f"Invalid offset + byte size for shared memory region: {brief_repr(name)} "
                f"(sordino: {owner} asks for {size} bytes at offset {offset} but the region "
                f"holds {region.byte_size} bytes)"
            )
        return region


def _check_size(name: str, datatype: str, shape: tuple[int, ...], size: int) -> None:
    """Refuse a fixed-size input whose byte size is not its tensor's before any copy
    (a huge declared size would otherwise be allocated and read first)."""
    if datatype == "BYTES":
        return  # its elements' lengths are in the data
    count = element_count(shape)
    expected = count * to_numpy_dtype(datatype).itemsize
    if size != expected:
        raise TensorError(
            f"input {brief_repr(name)} has shape {format_shape(shape)} ({count} {datatype} "
            f"elements, {expected} bytes) but its shared_memory_byte_size is {size}"
        )


def _most_regions() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_REGIONS_TOTAL
    return max(16, min(MAX_REGIONS_TOTAL, soft // 4))


def _output(name: str) -> str:
    return f"output {brief_repr(name)}"


def _object_path(name: str, key: str) -> str:
    if not isinstance(key, str) or not key.strip("/"):
        raise InvalidRequest(
            f"shared memory region {brief_repr(name)}: the key is {brief_repr(key)}; give the "
            "shm_open name of the object, such as '/my_region'"
        )
    base = key.lstrip("/")
    if "/" in base or base in {".", ".."} or "\0" in base:
        raise InvalidRequest(
            f"shared memory region {brief_repr(name)}: the key {brief_repr(key)} is not a "
            "shared memory object name; give a name such as '/my_region' (one leading slash, "
            "no other)"
        )
    if base.startswith(_OWN_PREFIXES):
        raise InvalidRequest(
            f"shared memory region {brief_repr(name)}: the key {brief_repr(key)} is reserved for "
            "sordino's own segments; create the object under another name"
        )
    return os.path.join(SHM_DIR, base)


def _open(name: str, key: str, path: str, offset: int, byte_size: int) -> Region:
    try:
        fd = os.open(path, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0) | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InvalidRequest(
            f"Unable to open shared memory region: {brief_repr(key)} (sordino: no shared memory "
            f"object {brief_repr(key)} exists; create it before registering region "
            f"{brief_repr(name)})"
        ) from None
    except OSError as exc:
        raise InvalidRequest(
            f"Unable to open shared memory region: {brief_repr(key)} (sordino: {exc.strerror})"
        ) from None
    try:
        stat = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise InvalidRequest(
            f"Unable to open shared memory region: {brief_repr(key)} (sordino: {exc.strerror})"
        ) from None
    if not stat_mode.S_ISREG(stat.st_mode):
        os.close(fd)
        raise InvalidRequest(
            f"Unable to open shared memory region: {brief_repr(key)} (sordino: it is not a "
            "shared memory object)"
        )
    if offset + byte_size > stat.st_size:
        os.close(fd)
        raise InvalidRequest(
            f"Invalid offset + byte size for shared memory region: {brief_repr(name)} (sordino: "
            f"offset {offset} + byte_size {byte_size} is past the end of object {brief_repr(key)}, "
            f"which holds {stat.st_size} bytes)"
        )
    return Region(name, key, offset, byte_size, fd, (stat.st_dev, stat.st_ino))
