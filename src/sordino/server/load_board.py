"""The engine's load in shared memory: what a front-end process needs to refuse alone.

With several front-end processes (``server.frontends``), a request the engine would
shed must be refused where it arrives, without a round trip: the engine publishes,
every few milliseconds, the figures the early-shed rules read
(``server/early_shed.py``), and each front end reads them from this board
(:class:`~sordino.server.board_shed.BoardShed`).

The block (one shared-memory segment, fixed size, created by the engine and recorded
in ``server.data_dir/shm`` like the arena's segments, so a killed engine's board is
removed at the next start; little-endian, offsets in bytes)::

    header, HEADER_SIZE (128) bytes
      0  magic        8s   b"SRDLOAD1"
      8  layout       u32  LAYOUT (2)
     12  slots        u32  number of route slots that follow
     16  seq          u64  the header's seqlock (odd while it is written)
     24  generation   u64  bumped when a slot changes hands (a route loaded/unloaded)
     32  published_at f64  time.monotonic() of the last publish (CLOCK_MONOTONIC)
     40  share        f64  engine LoopLag.share (1: every lower priority admitted)
     48  top_share    f64  engine LoopLag.top_share
     56  last_lag_s   f64  engine LoopLag.last_lag_s
     64  pid          u32  the publishing process
     68  flags        u32  bit 0 tenants required, bit 1 stopping
     72  overflow     u32  loaded routes with no slot (not on the board)
    then ``slots`` route slots of SLOT_SIZE (256) bytes each
      0  seq              u64  the slot's seqlock
      8  flags            u32  bit 0 used, 1 ready, 2 the name's default version,
                               3 eligible (no pipeline, sequences or result cache),
                               4 shed_late, 5 allow_timeout_override
     12  priority_levels  u16
     14  default_priority u16
     16  default_timeout  f64  seconds (0: none)
     24  name_len, version_len  u8, u8 (then 2 bytes of padding)
     28  json_values      u32  1 + the most values a request holds (0: no bound;
                               a front end refuses larger JSON before parsing it)
     32  name             96s  utf-8
    128  version          32s  utf-8
    160  waits            8 × f64  expected wait at priority 1..8 (NaN: unknown)
    224  rows_ahead       8 × u32  rows queued at priority 1..8 and higher

The contract. One writer (the engine's loop), any number of readers. A record (the
header, or one slot) is written as: its ``seq`` made odd, the fields, its ``seq`` made
even; a reader reads ``seq``, the fields, ``seq`` again, and uses the fields only if
both were the same even number — else it retries, a bounded number of times, and then
treats the record as absent (never waits). A reader never writes. Each ``seq`` is
an aligned 8-byte word read and written in one instruction (a memoryview cast to
``Q``, never ``struct.pack_into``, which zero-fills before it writes: a reader saw the
same passing value before and after a torn record); the order of the writer's stores
is x86-64's (TSO), where a seqlock needs no fence — a weakly ordered CPU (ARM) would
need one, which Python cannot express. On every publish the
header is written last, so a header ``seq`` that has not moved says nothing on the
board has (:meth:`LoadBoard.header_seq`). Priorities past the
eighth read the eighth's figures (a lower priority has at least as much ahead, so that
refuses less, never more: the engine's own admission still decides). A route whose name
or version does not fit, or that finds every slot taken, is not on the board (counted
in ``overflow``): a front end forwards its requests as for an unknown model. A board
not published for :data:`STALE_S` (the engine is stuck or gone) refuses nothing.
"""

from __future__ import annotations

import math
import os
import struct
import time
from collections.abc import Callable, Sequence
from multiprocessing import shared_memory
from pathlib import Path
from typing import IO, Any, NamedTuple

from sordino.errors import Shed
from sordino.memo import Memo
from sordino.memory.segments import attach_segment, close_segment, create_segment
from sordino.records import QueueSettings
from sordino.scheduling.shedding import late_refusal

__all__ = [
    "HEADER_SIZE",
    "LAYOUT",
    "MAX_LEVELS",
    "SLOT_SIZE",
    "STALE_S",
    "BoardHeader",
    "LoadBoard",
    "RouteLoad",
]

MAGIC = b"SRDLOAD1"
LAYOUT = 2
HEADER_SIZE = 128
SLOT_SIZE = 256
MAX_LEVELS = 8
"""Priority levels with figures of their own; lower ones read the last."""
NAME_BYTES = 96
VERSION_BYTES = 32
STALE_S = 1.0
"""A board not published for this long refuses nothing (its engine is stuck or gone)."""
_RETRIES = 64
_POLICIES_KEPT = 64

_Policy = tuple[int, int, float, int]
"""A route's queue policy as published: levels, default priority, timeout, flags."""


def _settings_of(policy: _Policy) -> QueueSettings:
    levels, default_priority, timeout, flags = policy
    return QueueSettings(
        priority_levels=levels,
        default_priority=default_priority,
        default_timeout_s=timeout,
        allow_timeout_override=bool(flags & _OVERRIDE),
        shed_late=bool(flags & _SHED_LATE),
    )


_HEAD = struct.Struct("<8sII")
_HEADER = struct.Struct("<QddddIII")  # at 24
_SLOT = struct.Struct(f"<IHHdBB2xI{NAME_BYTES}s{VERSION_BYTES}s{MAX_LEVELS}d{MAX_LEVELS}I")  # at 8
assert _HEADER.size + 24 <= HEADER_SIZE and _SLOT.size + 8 == SLOT_SIZE

_NO_VALUES = 0xFFFFFFFF
"""A route's ``json_values`` from here on is published as no bound (it must fit a u32)."""
_TENANTS, _STOPPING = 1, 2
_USED, _READY, _DEFAULT, _ELIGIBLE, _SHED_LATE, _OVERRIDE = 1, 2, 4, 8, 16, 32


class BoardHeader(NamedTuple):
    """The board's header: when it was published, the engine loop's lag shares (a
    tuple: a front end reads one each time the engine publishes)."""

    generation: int
    published_at: float
    share: float
    top_share: float
    last_lag_s: float
    pid: int
    tenants_required: bool
    stopping: bool
    overflow: int


class RouteLoad(NamedTuple):
    """One model route's load as published: what the early-shed rules read of it (a
    tuple: a front end reads one each time the engine publishes)."""

    name: str
    version: str
    default: bool
    """A request that names no version goes here (the highest loaded)."""
    ready: bool
    eligible: bool
    """Refusable from its headers: no pipeline, no sequences, no result cache."""
    settings: QueueSettings
    """The queue policy's fields admission's rules read (the others at their defaults)."""
    waits: tuple[float | None, ...]
    """Expected wait ahead at priority 1, 2, … (None: unknown), at most :data:`MAX_LEVELS`."""
    rows_ahead: tuple[int, ...]
    json_values: int | None = None
    """The most values a request to it holds (``protocol/validate.json_values``; None:
    no bound): a front end refuses a larger JSON body before parsing it."""

    def late(self, priority: int, timeout_s: float | None) -> Shed | None:
        """The scheduler's arrival rule (``late_refusal``) on the published figures."""
        if not timeout_s or not self.settings.shed_late or not self.waits:
            return None
        index = min(priority, len(self.waits)) - 1
        key = f"{self.name}/{self.version}"  # as ModelKey shows it: the same message
        return late_refusal(
            key, priority, timeout_s, self.waits[index], lambda: self.rows_ahead[index]
        )


class LoadBoard:
    """The shared-memory block: created by the engine (:meth:`create`), attached by
    front ends (:meth:`attach`). Writing is the publisher's (one writer)."""

    def __init__(
        self,
        shm: shared_memory.SharedMemory,
        record: IO[str] | None,
        *,
        owner: bool,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._shm = shm
        self._record = record
        self._owner = owner
        self.clock = clock
        """The clock :meth:`fresh` reads (``time.monotonic``, the publisher's)."""
        buf = shm.buf
        assert buf is not None
        self._buf: memoryview | None = buf
        # The sequences are read and written as aligned native 8-byte words, each in
        # one load or store: ``struct.pack_into`` zero-fills before it writes, so a
        # sequence written through it passes through other values (0 among them) and
        # a reader could see the same wrong value before and after a torn record.
        self._words: memoryview | None = buf.cast("Q") if len(buf) % 8 == 0 else None
        magic, layout, slots = _HEAD.unpack_from(buf, 0)
        if owner:
            slots = (shm.size - HEADER_SIZE) // SLOT_SIZE
            _HEAD.pack_into(buf, 0, MAGIC, LAYOUT, slots)
        elif magic != MAGIC or layout != LAYOUT or self._words is None:
            self.close()
            raise ValueError(f"shared-memory segment {shm.name!r} is not a sordino load board")
        self.slots: int = slots
        self._seqs = [0] * (slots + 1)  # the writer's: header's last
        self._generation = 0
        self._map: dict[tuple[str, str | None], int] = {}
        self._map_generation = -1
        self._policies: Memo[_Policy, QueueSettings] = Memo(_settings_of, _POLICIES_KEPT)

    @property
    def name(self) -> str:
        """The segment's name: what a front end passes to :meth:`attach`."""
        return self._shm.name

    @classmethod
    def create(cls, registry: Path | None, slots: int = 64) -> LoadBoard:
        """Create a board of ``slots`` route slots, recorded in ``registry`` (the arena's
        ``data_dir/shm``) so a stale one is removed at the next start."""
        if not 1 <= slots <= 4096:
            raise ValueError(f"a load board has 1..4096 slots, not {slots}")
        size = HEADER_SIZE + slots * SLOT_SIZE
        shm, record = create_segment(registry, size)
        return cls(shm, record, owner=True)

    @classmethod
    def attach(cls, name: str, *, clock: Callable[[], float] = time.monotonic) -> LoadBoard:
        """Map the board ``name`` read-only in use (a front end); raises
        ``FileNotFoundError`` if there is none, ``ValueError`` if it is not a board."""
        return cls(attach_segment(name), None, owner=False, clock=clock)

    def close(self) -> None:
        """Unmap the board; the engine's also removes it (and its record)."""
        buf, self._buf = self._buf, None
        if buf is None:
            return
        if self._words is not None:
            self._words.release()
            self._words = None
        buf.release()
        if self._owner:
            close_segment(self._shm, self._record)
        else:
            self._shm.close()

    def _view(self) -> memoryview:
        buf = self._buf
        if buf is None:
            raise ValueError("the load board is closed")
        return buf

    # -- writing (the engine's loop only) -----------------------------------------

    def write_header(
        self, *, share: float, top_share: float, last_lag_s: float, tenants_required: bool,
        stopping: bool, overflow: int, now: float | None = None,
    ) -> None:  # fmt: skip
        """Publish the header (and so the board's freshness) under its seqlock."""
        buf = self._view()
        flags = (_TENANTS if tenants_required else 0) | (_STOPPING if stopping else 0)
        published = self.clock() if now is None else now
        self._write(buf, 16, self.slots, _HEADER, (
            self._generation, published, share, top_share, last_lag_s, os.getpid(),
            flags, overflow,
        ))  # fmt: skip

    def write_route(self, slot: int, route: RouteLoad | None) -> None:
        """Publish ``route`` in ``slot`` (None: free it) under the slot's seqlock."""
        buf = self._view()
        if route is None:
            fields: tuple[object, ...] = (0, 0, 0, 0.0, 0, 0, 0, b"", b"")
            fields += (math.nan,) * MAX_LEVELS + (0,) * MAX_LEVELS
        else:
            name, version = route.name.encode(), route.version.encode()
            if len(name) > NAME_BYTES or len(version) > VERSION_BYTES:
                raise ValueError(f"route {route.name}:{route.version} does not fit a slot")
            s = route.settings
            flags = _USED | (_READY if route.ready else 0) | (_DEFAULT if route.default else 0)
            flags |= (_ELIGIBLE if route.eligible else 0) | (_SHED_LATE if s.shed_late else 0)
            flags |= _OVERRIDE if s.allow_timeout_override else 0
            waits = [math.nan if w is None else w for w in route.waits[:MAX_LEVELS]]
            rows = list(route.rows_ahead[:MAX_LEVELS])
            waits += [waits[-1] if waits else math.nan] * (MAX_LEVELS - len(waits))
            rows += [rows[-1] if rows else 0] * (MAX_LEVELS - len(rows))
            values = route.json_values
            given = 0 if values is None or values >= _NO_VALUES else values + 1
            fields = (
                flags, s.priority_levels, s.default_priority, s.default_timeout_s,
                len(name), len(version), given, name, version, *waits, *rows,
            )  # fmt: skip
        self._write(buf, HEADER_SIZE + slot * SLOT_SIZE, slot, _SLOT, fields)

    def bump_generation(self) -> None:
        """Say that slots changed hands: readers rebuild their name → slot map."""
        self._generation += 1

    def _write(
        self, buf: memoryview, offset: int, index: int, layout: struct.Struct,
        fields: Sequence[object],
    ) -> None:  # fmt: skip
        words = self._words
        assert words is not None
        seq = self._seqs[index] + 1
        words[offset >> 3] = seq  # odd: being written
        layout.pack_into(buf, offset + 8, *fields)
        self._seqs[index] = seq + 1
        words[offset >> 3] = seq + 1  # even: whole

    # -- reading (any process) ----------------------------------------------------

    def _read(self, offset: int, layout: struct.Struct) -> tuple[Any, ...] | None:
        """One record's fields under its seqlock, or None if it kept changing."""
        buf = self._view()
        words = self._words
        assert words is not None
        index = offset >> 3
        for _ in range(_RETRIES):
            before = words[index]
            if before & 1:
                continue
            fields = layout.unpack_from(buf, offset + 8)
            if words[index] == before:
                return fields
        return None

    def header_seq(self) -> int:
        """The header's seqlock now: unchanged (and even) since a :meth:`header` read,
        nothing on the board changed (the header is written last on every publish).
        Raises ``ValueError`` once the board is closed."""
        words = self._words
        if words is None:
            raise ValueError("the load board is closed")
        seq: int = words[2]
        return seq

    def header(self) -> BoardHeader | None:
        """The header as last published, or None if it could not be read whole."""
        fields = self._read(16, _HEADER)
        if fields is None:
            return None
        generation, published, share, top, lag, pid, flags, overflow = fields
        return BoardHeader(
            generation, published, share, top, lag, pid,
            bool(flags & _TENANTS), bool(flags & _STOPPING), overflow,
        )  # fmt: skip

    def fresh(self, header: BoardHeader) -> bool:
        """Whether ``header`` was published within :data:`STALE_S`."""
        return self.clock() - header.published_at <= STALE_S

    def route_at(self, slot: int) -> RouteLoad | None:
        """The route in ``slot``, or None if the slot is free (or could not be read)."""
        fields = self._read(HEADER_SIZE + slot * SLOT_SIZE, _SLOT)
        if fields is None or not fields[0]:
            return None
        flags: int = fields[0]
        levels, default_priority, timeout, name_len, version_len, given, name, version = fields[1:9]
        waits = fields[9 : 9 + MAX_LEVELS]
        rows = fields[9 + MAX_LEVELS :]
        shown = min(levels, MAX_LEVELS)
        # One QueueSettings for each policy seen: the same object from one publish to
        # the next, so what a reader derived from it (admission's choices) is kept.
        policy: _Policy = (levels, default_priority, timeout, flags & (_OVERRIDE | _SHED_LATE))
        settings = self._policies[policy]
        return RouteLoad(
            name=name[:name_len].decode(errors="replace"),
            version=version[:version_len].decode(errors="replace"),
            default=bool(flags & _DEFAULT),
            ready=bool(flags & _READY),
            eligible=bool(flags & _ELIGIBLE),
            settings=settings,
            waits=tuple(None if math.isnan(w) else w for w in waits[:shown]),
            rows_ahead=tuple(rows[:shown]),
            json_values=given - 1 if given else None,
        )

    def routes(self) -> list[RouteLoad]:
        """Every route on the board now."""
        return [r for i in range(self.slots) if (r := self.route_at(i)) is not None]

    def find(self, header: BoardHeader, name: str, version: str | None) -> RouteLoad | None:
        """The route a request for ``name`` (``version``: None or empty for the
        default) goes to, or None if it is not on the board."""
        if header.generation != self._map_generation:
            self._map = {}
            for index in range(self.slots):
                found = self.route_at(index)
                if found is not None:
                    self._map[found.name, found.version] = index
                    if found.default:
                        self._map[found.name, None] = index
            self._map_generation = header.generation
        slot = self._map.get((name, version or None))
        if slot is None:
            return None
        route = self.route_at(slot)
        if route is None or route.name != name or (version and route.version != version):
            self._map_generation = -1  # it changed hands since: look again next time
            return None
        return route
