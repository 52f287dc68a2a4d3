"""Read deadlines and refusals of one HTTP connection (the guard's side of it).

:class:`GuardedReads` is the part of ``server/http_protocol.py``'s protocol that
enforces ``server/connection_guard.py``'s limits: the header and body deadlines (checked
by the guard's sweep), the slow-body budget, the monitoring reserve's late 503, a
request refused from its headers (its body skipped unread), and whole refused requests
answered from their bytes without the parser (:meth:`GuardedReads._refuse_whole`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import TYPE_CHECKING, Any, ClassVar

from sordino.server import connection_guard
from sordino.server.connection_guard import Admission, ConnectionGuard, Phase, ShedCheck

if TYPE_CHECKING:
    from sordino.server.http_cycle import Cycle

__all__ = ["GuardedReads"]


class GuardedReads(asyncio.Protocol):
    """The guard's state on a connection, and what it does when a limit is reached."""

    guard: ClassVar[ConnectionGuard]
    transport: asyncio.Transport
    parser: Any
    cycle: Cycle | None
    pipeline: deque[Cycle]
    expect_100_continue: bool
    server_state: Any

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.admission: Admission | None = None  # set at accept on a TLS listener
        self._address = ""
        self._admitted = False
        self._made = False
        self._early: list[bytes] = []  # TLS data that came before connection_made
        self._refused_late = False  # a reserve connection answered 503: reads are dropped
        self._body_began = 0.0
        self._body_bytes = 0
        self._held = 0  # of the body being read, buffered: in guard.pending_body_bytes
        self._phase: Phase | None = None
        self._timer: asyncio.TimerHandle | None = None  # a refused connection's linger
        self.deadline: float | None = None  # when the phase being read times out
        self._request_bytes = False  # some of the current request's headers arrived
        self._shedding = False  # the current request was refused from its headers
        self._discard = 0  # bytes still to come of a body refused unread (_refuse_whole)
        self._asked = False  # the request the parser reads next was admitted unparsed
        self._head_bytes = 0  # of the head being read, over its reads (head_grew)
        self._head_seen = 0  # of its URL and whole header lines, as parsed
        self._heads = 0  # heads read whole on this connection
        self.head_too_large = False  # a parser callback saw the head pass the limit

    def forget(self) -> None:
        """Release what :meth:`ConnectionGuard.admit` counted for this connection (once)."""
        if self.admission is not None:
            self.guard.release(self.admission)
            self.admission = None

    def on_response_complete(self) -> None:
        raise NotImplementedError

    def _idle(self) -> None:
        raise NotImplementedError

    def end_keep_alive(self) -> None:
        raise NotImplementedError

    def _unset_keep_alive(self) -> None:
        raise NotImplementedError

    def _refuse_whole(self, data: bytes, shed: ShedCheck) -> bytes:
        """Refuse the requests ``data`` starts with, unparsed; return the rest.

        The fast path of a refusal from the headers: at a boundary between requests,
        each request in ``data`` whose head is whole (a plain keep-alive HTTP/1.1 POST
        with a ``Content-Length``) that :attr:`ConnectionGuard.early_shed` refuses is
        answered at once, without the HTTP parser's callbacks — a tenth to a fifth of
        a refusal's CPU under overload (docs/benchmarks.md, "Overload, third pass").
        Its body is skipped by length: the part not here yet is dropped as it comes
        (:meth:`_drop_body`), under the body's deadlines, without the parser. Tried only
        while requests are being refused (:meth:`ShedCheck.refusing`). Anything else —
        a request it would serve, an incomplete head, chunked, ``Expect``, not plainly
        keep-alive HTTP/1.1, or a header it cannot read — stops the fast path, and the
        parser takes the rest from that request on, as before.
        """
        refused = 0
        transport = self.transport
        while data[:5] == b"POST " and not transport.is_closing():
            end = data.find(b"\r\n\r\n")
            head = connection_guard.plain_head(data, end) if end > 0 else None
            if head is None:
                break
            response = shed(head[0], head[1])
            if response is None:
                # Admitted: the parser reads it next, and must not ask again (a share
                # admitted by credit would be asked twice, and admitted squared).
                self._asked = True
                break
            transport.write(response)
            refused += 1
            following = end + 4 + head[2]
            if following > len(data):  # the rest of its body is still to come
                self.server_state.total_requests += refused
                self._unset_keep_alive()
                self._arm("body")
                self._body_bytes = len(data) - end - 4
                self._discard = following - len(data)
                if self.guard.too_many_bodies():
                    self.guard.evict_bodies()
                return b""
            data = data[following:]
        if refused:
            # (Busy again if a request follows: its parser callbacks or the next read
            # unset the keep-alive; idle, it is set below.)
            self.server_state.total_requests += refused
            self._disarm()  # between requests, as after any answer
            if not data:  # idle now: the keep-alive timeout runs, as after any answer
                self._idle()
        return data

    def _drop_body(self, data: bytes) -> bytes:
        """Drop what ``data`` holds of the body of a request refused by
        :meth:`_refuse_whole` (``_discard`` bytes still to come); return the rest."""
        discard = self._discard
        size = len(data)
        if size >= connection_guard.LARGE_READ:
            self.guard.trimmer.note(self.loop, size)
        if size < discard:
            self._discard = discard - size
            self._body_bytes += size
            return b""
        self._discard = 0
        self._disarm()  # between requests, as after any answer
        if size == discard:
            self._idle()
            return b""
        return data[discard:]

    def _shed(self, response: bytes) -> None:
        """Answer the request whose headers were just read with ``response``; skip its body."""
        self._shedding = True
        if self.expect_100_continue or not self.parser.should_keep_alive():
            # The client waits to send its body (or closes after the answer): end here.
            # The body bytes already here are still parsed, and still dropped.
            self.transport.write(response.replace(b"\r\n", b"\r\nconnection: close\r\n", 1))
            self.transport.close()
            return
        self.transport.write(response)
        self._arm("body")  # the body still has to arrive (and is dropped) in time

    # -- the head's size -------------------------------------------------------------

    def head_grew(self, size: int, phase_before: Phase | None, heads_before: int) -> bool:
        """After a read of ``size`` bytes that left a request's head incomplete: count
        them; past ``server.max_header_size`` answer 431 and close (True). The parser
        holds an incomplete header line without a callback, so the bytes are counted
        here; a read in which a head began counts from the next one (the bound is then
        one read more)."""
        if self._heads != heads_before or phase_before == "body":
            self._head_bytes = 0
            return False
        self._head_bytes += size
        if self._head_bytes <= self.guard.max_header_size:
            return False
        self.refuse_head()
        return True

    def refuse_head(self) -> None:
        """Answer 431 for a request line and headers past the limit, and close."""
        self._disarm()
        limit = self.guard.max_header_size
        self._answer(
            431,
            f"the request line and headers are larger than {limit} bytes "
            "(server.max_header_size): send fewer or shorter headers, or a shorter URL",
        )
        self.transport.close()

    # -- timeouts and refusals -------------------------------------------------------

    def _arm(self, phase: Phase) -> None:
        guard = self.guard
        now = self.loop.time()
        self._phase = phase
        self._request_bytes = False
        if phase == "header":
            self.deadline = now + guard.header_timeout
            return
        self._body_began, self._body_bytes = now, 0
        self.deadline = now + (
            min(guard.body_timeout, guard.body_rate_grace)
            if guard.body_min_rate > 0
            else guard.body_timeout
        )
        guard.pending_bodies[self] = None

    def _disarm(self) -> None:
        if self._phase == "body":
            guard = self.guard
            guard.pending_bodies.pop(self, None)
            if self._held:
                guard.pending_body_bytes -= self._held
                self._held = 0
        self._phase = None
        self.deadline = None
        self._request_bytes = False

    def _slow_body(self, now: float) -> str | None:
        """Why the body being read is too slow at ``now``, or None after moving the
        deadline to when it would be (the minimum rate's check, as ``mod_reqtimeout``)."""
        guard = self.guard
        final = self._body_began + guard.body_timeout
        if now >= final:
            return f"the request body did not arrive within {guard.body_timeout:g} s"
        earned = max(guard.body_rate_grace, self._body_bytes / guard.body_min_rate)
        due = self._body_began + earned
        if now < due:
            self.deadline = min(final, due)
            return None
        return (
            f"the request body arrived slower than {guard.body_min_rate:g} bytes/s "
            f"(server.body_min_rate): {self._body_bytes} bytes in {now - self._body_began:.1f} s"
        )

    def expire(self, now: float, *, because: str | None = None) -> None:
        """The phase being read ran past its deadline (or, ``because``, must end now):
        answer 408 if due, and close."""
        phase, request_bytes = self._phase, self._request_bytes
        if phase == "body" and because is None:
            because = (
                self._slow_body(now)
                if self.guard.body_min_rate > 0
                else f"the request body did not arrive within {self.guard.body_timeout:g} s"
            )
            if because is None:
                return  # not behind: the deadline moved on
        self._disarm()
        if phase is None or self.transport.is_closing():
            return
        if self.admission is not None and self.admission.kind == "reserve" and phase == "header":
            self._refuse_reserved()
            return
        self.guard.timed_out(phase, self._address)
        cycle = self.cycle
        idle = cycle is None or cycle.response_complete
        if phase == "header" and request_bytes and idle:
            seconds = self.guard.header_timeout
            self._answer(408, f"the request headers did not arrive within {seconds:g} s")
        elif phase == "body" and cycle is not None and not cycle.response_started:
            # The application waits for the body: it now hears a disconnect, and its
            # answer (if any) is dropped instead of following ours.
            cycle.disconnect()
            self._answer(408, because or "the request body did not arrive in time")
        self.transport.close()

    def _refuse_reserved(self) -> None:
        """A connection of the monitoring reserve asked for something else (or nothing in
        :data:`RESERVE_WAIT_S`): answer the 503 it was spared at connect, and close."""
        self._timer = None
        admission = self.admission
        if admission is None or self._refused_late or self.transport.is_closing():
            return
        self._refused_late = True
        self._disarm()
        self.guard.unwatch(self)
        self.guard.refused(admission.scope, admission.client)
        self._timer = self.guard.refuse(self.transport, admission.refusal, self.loop)

    def stop_reading_body(self) -> None:
        """The server stops and the request being read has not sent its body whole: it
        was not taken, and waiting for it would hold the stop (up to uvicorn's grace,
        then a cancel); answer 503 now, and close."""
        cycle = self.cycle
        self._disarm()
        if cycle is not None and not cycle.response_started:
            cycle.disconnect()  # its task (if it has one) ends without an answer
            self._answer(
                503,
                "the server is stopping and the request body had not arrived whole; "
                "send the request again (to another instance)",
                retry_after=True,
            )
        self.transport.close()

    def _answer(self, status: int, message: str, *, retry_after: bool = False) -> None:
        self.transport.write(
            connection_guard.error_response(status, message, retry_after=retry_after)
        )
