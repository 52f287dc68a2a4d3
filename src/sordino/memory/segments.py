"""The arena's shared-memory segments: created and recorded, attached, removed when stale.

A segment outlives a server killed with SIGKILL (nothing runs to remove it). So that
the next server on the same data dir can remove it, an arena given a ``registry``
folder records its segment there as a file of the same name, locked (``flock``) for
as long as the arena is open (:func:`create_recorded`); :func:`remove_stale_segments`
removes every recorded segment whose file nobody holds locked any more: its server is
gone, however it ended. Worker processes :func:`attach_segment` without taking
ownership of it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path
from typing import IO, Any

from sordino.errors import OutOfMemory

__all__ = [
    "SEGMENTS_DIR",
    "SHM_DIR",
    "StaleSegment",
    "attach_segment",
    "close_segment",
    "create_recorded",
    "create_segment",
    "remove_stale_segments",
    "reserve",
    "segment_path",
    "shm_free_bytes",
]

SHM_DIR = "/dev/shm"
"""Where Linux keeps POSIX shared-memory objects (a tmpfs)."""

SEGMENTS_DIR = "shm"
"""The folder of ``server.data_dir`` where the arena records its segment."""

log = logging.getLogger("sordino.memory")


def close_segment(shm: shared_memory.SharedMemory, record: IO[str] | None) -> None:
    """Unmap and remove one segment of the arena, and its record."""
    try:
        shm.close()
    except BufferError:  # a numpy view still exists; the unlink below still frees it
        log.debug("arena segment %s closed with live views", shm.name)
    shm.unlink()
    if record is not None:
        # Remove the record while still holding its lock: a server cleaning up
        # meanwhile finds nothing to do, or a segment already gone.
        Path(record.name).unlink(missing_ok=True)
        record.close()


def attach_segment(name: str) -> shared_memory.SharedMemory:
    """Map the arena segment ``name`` in a worker process, without taking ownership.

    Python < 3.13 registers every attached segment with the resource tracker, which
    would unlink the server's segment when the worker exits; registration is skipped.
    """
    with _untracked("register"):
        return shared_memory.SharedMemory(name=name)


@contextmanager
def _untracked(call: str) -> Iterator[None]:
    """Keep the resource tracker out of one segment (its ``register`` or ``unregister``)."""
    original: Callable[..., Any] = getattr(resource_tracker, call)
    setattr(resource_tracker, call, lambda *args, **kwargs: None)
    try:
        yield
    finally:
        setattr(resource_tracker, call, original)


@dataclass(frozen=True, slots=True)
class StaleSegment:
    """A segment left by a server that is gone, as :func:`remove_stale_segments` found it."""

    name: str
    pid: int | None
    """The process that created it, as its record says."""
    size_bytes: int | None
    """Its size as recorded; None if the record did not say."""
    removed: bool
    """False when the segment itself was already gone (only its record was left)."""


def create_segment(
    registry: Path | None, capacity: int
) -> tuple[shared_memory.SharedMemory, IO[str] | None]:
    """Create a segment of ``capacity`` bytes with every page backed now
    (:func:`reserve`), recorded in ``registry`` where one is given (its record, or
    None); ``OutOfMemory`` where ``/dev/shm`` has no room for it."""
    if registry is None:
        shm, record = shared_memory.SharedMemory(create=True, size=capacity), None
    else:
        shm, record = create_recorded(registry, capacity)
    try:
        reserve(shm.name, capacity)
    except BaseException:
        close_segment(shm, record)
        raise
    return shm, record


def reserve(name: str, size: int) -> None:
    """Back the first ``size`` bytes of the segment ``name`` with pages now
    (``posix_fallocate``), or raise ``OutOfMemory`` saying /dev/shm is full.

    A new segment is a hole: its pages are taken from /dev/shm (a tmpfs) when first
    written. Had anything else filled /dev/shm by then (a client's shared-memory
    region, another program, a container's 64 MB default), that first write would
    raise SIGBUS and end the process that made it — the server or a worker — on the
    spot. Reserved, the segment's writes cannot fail. Where the segment is no file in
    /dev/shm (not Linux) or its file system cannot reserve, nothing changes."""
    try:
        fd = os.open(segment_path(name), os.O_RDWR)
    except OSError:
        return
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EFBIG, errno.ENOMEM):
            log.debug("cannot reserve the pages of %s: %s", name, exc)
            return
        free = shm_free_bytes()
        raise OutOfMemory(
            f"/dev/shm has no room for a shared-memory segment of {size} bytes"
            + (f" ({free} bytes free)" if free is not None else "")
            + "; free /dev/shm (a container's is 64 MB unless run with --shm-size), or "
            "lower workers.shared_memory"
        ) from None
    finally:
        os.close(fd)


def segment_path(name: str) -> str:
    """The file of the shared-memory object ``name`` (``/x`` or ``x``) in :data:`SHM_DIR`."""
    return os.path.join(SHM_DIR, name.lstrip("/"))


def create_recorded(
    registry: Path, capacity: int
) -> tuple[shared_memory.SharedMemory, IO[str] | None]:
    """Create a segment recorded in ``registry``; unrecorded if the folder is unusable.
    Its pages are not reserved: :func:`create_segment` does both."""
    name = f"sordino-{os.getpid()}-{secrets.token_hex(4)}"  # <= 31 bytes with "/" (macOS)
    record: IO[str] | None = None
    try:
        registry.mkdir(parents=True, exist_ok=True)
        record = open(registry / name, "x", encoding="utf-8")  # noqa: SIM115 - held until close()
        fcntl.flock(record, fcntl.LOCK_EX | fcntl.LOCK_NB)
        record.write(f"{os.getpid()} {capacity}\n")
        record.flush()
    except OSError as exc:
        if record is not None:
            Path(record.name).unlink(missing_ok=True)
            record.close()
        log.warning(
            "cannot record the shared-memory segment in %s (%s): a hard crash would leave it "
            "in /dev/shm",
            registry,
            exc,
        )
        return shared_memory.SharedMemory(create=True, size=capacity), None
    try:
        return shared_memory.SharedMemory(name=name, create=True, size=capacity), record
    except BaseException:
        Path(record.name).unlink(missing_ok=True)
        record.close()
        raise


def remove_stale_segments(registry: Path) -> list[StaleSegment]:
    """Remove the segments recorded in ``registry`` whose server is gone; return them.

    A record whose lock nobody holds belongs to a server that ended without closing
    its arena (SIGKILL, a crash): its segment and the record are removed. Records of
    running servers (this process's included) are locked and left alone.
    """
    found: list[StaleSegment] = []
    try:
        records = sorted(registry.glob("sordino-*"))
    except OSError:
        return found
    for path in records:
        try:
            handle = open(path, "r+", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError:  # removed meanwhile, or unreadable: not ours to judge
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # its server holds the lock: alive
                continue
            if not path.exists():  # closed cleanly while we waited for the lock
                continue
            pid, size = _parse_record(handle.read())
            removed = _unlink_segment(path.name)
            path.unlink(missing_ok=True)
        found.append(StaleSegment(path.name, pid, size, removed))
    return found


def _parse_record(text: str) -> tuple[int | None, int | None]:
    fields = text.split()
    numbers = [int(f) if f.isdigit() else None for f in fields[:2]]
    numbers += [None] * (2 - len(numbers))
    return numbers[0], numbers[1]


def _unlink_segment(name: str) -> bool:
    """Remove the segment ``name``; False if there was none."""
    try:
        segment = attach_segment(name)
    except FileNotFoundError:
        return False
    segment.close()
    with _untracked("unregister"):  # this process never registered it
        segment.unlink()
    return True


def shm_free_bytes() -> int | None:
    """Free bytes of /dev/shm, or None where it cannot be read."""
    try:
        stat = os.statvfs(SHM_DIR)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize
