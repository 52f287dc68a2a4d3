"""A front-end process's side of the engine link (``server/engine_link.py`` is the other).

:class:`FrontendLink` sends each inference request as one frame and resolves its
future with the engine's answer; many requests share the connection, the requests of
one event-loop turn go in one write, and each read may complete many answers. A
client that leaves cancels its request (:meth:`FrontendLink.cancel`). When the engine
is gone every request waiting on it, and every later one, is answered 503 at once —
never left hanging — and :attr:`FrontendLink.closed` is set (the process then ends).

A ``RESULT`` whose outputs the engine holds in its arena (descriptors,
``server/link_tensors.py``) is read in place through :attr:`FrontendLink.arena`; the
caller encodes it and then calls :meth:`FrontendLink.done`, and the ids done in one
event-loop turn go back in one ``RELEASE``. Such a response may be read only while
:meth:`FrontendLink.readable` says so: once this end of the link is closed the engine
may have released it.

:func:`hand_over` moves a connection to the engine (``SCM_RIGHTS``) with the bytes
already read from it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket

from sordino.inference import InferRequest, InferResponse
from sordino.memory.grant import GrantSpace
from sordino.memory.peer_view import ArenaView
from sordino.protocol.encode import encode_error
from sordino.records import ConnectionStatistics
from sordino.server import link_arena, link_frames, link_tensors
from sordino.server.link_frames import (
    HANDOVER_CHUNK,
    HANDOVER_HEAD,
    Answer,
    FrameError,
    FrameReader,
    LinkRequest,
)
from sordino.server.stream_window import StreamWindow

__all__ = ["ENGINE_GONE", "FrontendLink", "Reply", "hand_over"]

log = logging.getLogger("sordino.frontends")

ENGINE_GONE = (
    "the engine process of this server is gone (stopped or crashed); this front end is "
    "stopping: retry against a running server"
)


_UNREADABLE = (
    "this front end cannot map the engine's shared-memory arena to read the response; "
    "see the server's log"
)
_JSON = {"Content-Type": "application/json"}

Reply = Answer | tuple[InferResponse, bool]
"""What the engine sends back: an answer to write as it is, or a decoded request's
response (to encode here) and whether to close the connection after it."""


class FrontendLink(link_frames.BatchedWrites, asyncio.Protocol):
    """The front end's link connection (see the module's docstring)."""

    def __init__(self) -> None:
        self.reader = FrameReader()
        self.waiting: dict[int, asyncio.Future[Reply]] = {}
        self.streams: dict[int, asyncio.Queue[bytes | Answer]] = {}  # ModelStreamInfer
        self.windows: dict[int, StreamWindow] = {}  # each stream's messages it may send
        self.out: list[bytes] = []
        self.next_id = 0
        self.transport: asyncio.Transport | None = None
        self.closed = asyncio.Event()
        self._writable: asyncio.Future[None] | None = None  # set while the engine lags
        self.arena = ArenaView()
        """The engine's arena, mapped read-only when a result first names it."""
        self.held: set[int] = set()  # results read in place, not done yet
        self.space: GrantSpace | None = None
        """The block of the arena this front end lays decoded inputs into (``GRANT``)."""
        self._released: list[int] = []  # done this turn: the next RELEASE

    @classmethod
    async def open(cls, path: str, *, hello: bool = True) -> FrontendLink:
        """Connect to the engine's link socket at ``path`` and say hello (``hello``
        false: later, with :meth:`say_hello`, once this process listens)."""
        loop = asyncio.get_running_loop()
        _, link = await loop.create_unix_connection(cls, path)
        if hello:
            link.say_hello()
        return link

    def say_hello(self) -> None:
        """Tell the engine this process's pid: it counts the front end as started."""
        assert self.transport is not None
        self.transport.write(link_frames.encode_hello(os.getpid()))

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.resume_writing()
        waiting, self.waiting = self.waiting, {}
        for ident, future in waiting.items():
            if not future.done():
                future.set_result(gone_answer(ident))
        streams, self.streams = self.streams, {}
        for ident, inbox in streams.items():
            inbox.put_nowait(gone_answer(ident))
        self.windows.clear()
        self.held.clear()  # the engine releases them all when the link ends
        self.space = None  # and takes its grant back
        self._released.clear()
        self.closed.set()

    def data_received(self, data: bytes) -> None:
        try:
            for kind, body in self.reader.feed(data):
                reply: Reply
                if kind == link_tensors.RESULT:
                    try:
                        ident, response, close, held = link_tensors.decode_result(body, self.arena)
                    except link_arena.Unreadable as exc:
                        log.error("the engine's arena cannot be mapped here: %s", exc)
                        ident, held = exc.ident, False
                        self._release(ident)
                        reply = Answer(ident, 500, encode_error(_UNREADABLE), _JSON)
                    else:
                        reply = (response, close)
                        if held:
                            self.held.add(ident)
                elif kind == link_arena.FREED:
                    if self.space is not None:
                        for offset in link_arena.decode_ids(body):
                            self.space.free(offset)
                    continue
                elif kind == link_arena.GRANT:
                    self._granted(*link_arena.decode_grant(body))
                    continue
                elif kind == link_tensors.STREAM_MESSAGE:
                    ident, raw = link_tensors.decode_stream_message(body)
                    inbox = self.streams.get(ident)
                    if inbox is not None:
                        inbox.put_nowait(raw)
                    continue
                elif kind == link_tensors.STREAM_CREDIT:  # the engine read messages
                    ident, count = link_tensors.decode_stream_credit(body)
                    window = self.windows.get(ident)
                    if window is not None:
                        window.grant(count)
                    continue
                elif kind == link_frames.ANSWER:
                    reply = link_frames.decode_answer(body)
                    ident = reply.id
                    self.windows.pop(ident, None)
                    ended = self.streams.pop(ident, None)
                    if ended is not None:  # a stream's end status
                        ended.put_nowait(reply)
                        continue
                else:
                    raise FrameError(f"an unexpected frame kind {kind}")
                future = self.waiting.pop(ident, None)
                if future is not None and not future.done():
                    future.set_result(reply)
                else:
                    self.done(ident)  # nobody waits for it (the client left): let go
        except FrameError as exc:
            log.error("the engine sent a broken frame (%s); the link is closed", exc)
            if self.transport is not None:
                self.transport.close()

    def pause_writing(self) -> None:
        if self._writable is None:
            self._writable = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        writable, self._writable = self._writable, None
        if writable is not None and not writable.done():
            writable.set_result(None)

    async def writable(self) -> None:
        """Wait while the link's write buffer is full (the engine reads slower than the
        front end sends): requests then wait here, unsent, rather than pile up in memory."""
        if self._writable is not None:
            await asyncio.shield(self._writable)

    def call(self, request: LinkRequest) -> asyncio.Future[Reply]:
        """Send ``request`` (its id is set here); the future gets the engine's answer."""
        future, request.id = self._future()
        if request.id:
            self._write(link_frames.encode_request(request))
        return future

    def call_decoded(
        self, request: InferRequest, read_s: float
    ) -> tuple[int, asyncio.Future[Reply]]:
        """Send a decoded ``request``; its id and the future of the engine's reply.

        Raises SordinoError for a tensor that cannot be sent (nothing is then waiting).
        """
        future, ident = self._future()
        if ident:
            try:
                parts, _ = link_tensors.encode_infer(ident, request, read_s, space=self.space)
            except BaseException:
                self.waiting.pop(ident, None)
                raise
            self._write(parts)
        return ident, future

    def call_grpc(self, request: InferRequest, room: int) -> tuple[int, asyncio.Future[Reply]]:
        """Send a ``ModelInfer`` decoded here (``GRPC_INFER``; ``room``: the message's
        size); its id and the future of the engine's reply: a response, or an
        :class:`Answer` whose status is the gRPC code (> 16: the engine is gone).

        Raises SordinoError for a tensor that cannot be sent (nothing is then waiting).
        """
        future, ident = self._future()
        if ident:
            try:
                parts, _ = link_tensors.encode_infer(
                    ident, request, 0.0, kind=link_tensors.GRPC_INFER, room=room
                )
            except BaseException:
                self.waiting.pop(ident, None)
                raise
            self._write(parts)
        return ident, future

    def call_unary(
        self, method: str, peer: str, metadata: list[tuple[str, str]], raw: bytes
    ) -> tuple[int, asyncio.Future[Reply]]:
        """Forward a unary gRPC call (``CALL``); its id and the future of the engine's
        :class:`Answer` (the gRPC code as status; > 16: the engine is gone)."""
        future, ident = self._future()
        if ident:
            call = link_tensors.Call(ident, method, peer, metadata, raw)
            self._write(link_tensors.encode_call(call))
        return ident, future

    def open_stream(
        self, peer: str, metadata: list[tuple[str, str]]
    ) -> tuple[int, asyncio.Queue[bytes | Answer]]:
        """Open a forwarded ``ModelStreamInfer`` (``STREAM_OPEN``); its id and the queue
        of what the engine sends: each serialized response, then the :class:`Answer`
        that ends the stream (the gRPC code as status; > 16: the engine is gone). The
        engine sends at most ``link_tensors.STREAM_WINDOW`` responses more than
        :meth:`stream_credit` has granted, so the queue holds at most that many."""
        self.next_id += 1
        ident = self.next_id
        inbox: asyncio.Queue[bytes | Answer] = asyncio.Queue()
        if self.transport is None or self.transport.is_closing():
            inbox.put_nowait(gone_answer(ident))
            return ident, inbox
        self.streams[ident] = inbox
        self.windows[ident] = StreamWindow(link_tensors.STREAM_WINDOW)
        call = link_tensors.Call(ident, "ModelStreamInfer", peer, metadata, b"")
        self._write(link_tensors.encode_call(call, link_tensors.STREAM_OPEN))
        return ident, inbox

    async def stream_room(self, ident: int) -> None:
        """Wait until stream ``ident`` may forward one more message: at most
        ``link_tensors.STREAM_WINDOW`` the engine has not read yet cross (``STREAM_CREDIT``
        from the engine as it reads them), so a client that sends faster than the
        engine takes its messages waits in gRPC's flow control, not in either memory."""
        window = self.windows.get(ident)
        if window is not None:
            await window.take()

    def stream_message(self, ident: int, raw: bytes) -> None:
        """Forward the client's next message on stream ``ident`` (after :meth:`stream_room`)."""
        if ident in self.streams:
            self._write(link_tensors.encode_stream_message(ident, raw))

    def stream_credit(self, ident: int, count: int = 1) -> None:
        """gRPC took ``count`` responses of stream ``ident`` for the client: the engine may
        send as many more (it sends at most ``link_tensors.STREAM_WINDOW`` ahead)."""
        if ident in self.streams:
            self._write([link_tensors.encode_stream_credit(ident, count)])

    def stream_end(self, ident: int) -> None:
        """The client of stream ``ident`` half-closed: it sends no more."""
        if ident in self.streams:
            self._write([link_tensors.encode_stream_end(ident)])

    def cancel_stream(self, ident: int) -> None:
        """The client cancelled stream ``ident``: the engine cancels it; nothing follows."""
        self.windows.pop(ident, None)
        if self.streams.pop(ident, None) is not None:
            self._write([link_frames.encode_cancel(ident)])

    def refused(
        self, model: str, version: str | None, tenant: str | None, reason: str, count: int = 1
    ) -> None:
        """Tell the engine of ``count`` requests answered here with an error, to count them."""
        if self.transport is not None and not self.transport.is_closing():
            self._write([link_tensors.encode_refused(model, version, tenant, reason, count)])

    def connections(self, stats: ConnectionStatistics) -> None:
        """Tell the engine this front end's connection figures (``CONNECTIONS``)."""
        if self.transport is not None and not self.transport.is_closing():
            self._write([link_frames.encode_connections(stats)])

    def _future(self) -> tuple[asyncio.Future[Reply], int]:
        """A new request's future and id; id 0 (and the 503) when the engine is gone."""
        future: asyncio.Future[Reply] = asyncio.get_running_loop().create_future()
        self.next_id += 1
        if self.transport is None or self.transport.is_closing():
            future.set_result(gone_answer(self.next_id))
            return future, 0
        self.waiting[self.next_id] = future
        return future, self.next_id

    def readable(self, ident: int) -> bool:
        """Whether result ``ident``'s outputs may be read now: it is not held in the
        engine's arena, or this end of the link is still open (the engine holds it)."""
        return ident not in self.held or self.transport is not None

    def done(self, ident: int) -> None:
        """Result ``ident`` is encoded (or dropped): the engine may release what it holds
        for it (one ``RELEASE`` per event-loop turn). Safe to call for any id, once."""
        if ident in self.held:
            self.held.discard(ident)
            self._release(ident)

    def _release(self, ident: int) -> None:
        if self.transport is None or self.transport.is_closing():
            return  # the engine releases everything when the link ends
        if not self._released:
            asyncio.get_running_loop().call_soon(self._flush_released)
        self._released.append(ident)

    def _flush_released(self) -> None:
        released, self._released = self._released, []
        if released:
            self._write([link_arena.encode_ids(link_arena.RELEASE, released)])

    def _granted(self, segment: str, offset: int, size: int) -> None:
        try:
            self.space = GrantSpace(segment, offset, size)
        except OSError as exc:  # inputs then cross as bytes
            log.warning("the engine's arena grant cannot be mapped here: %s", exc)

    def cancel(self, ident: int) -> None:
        """The client of request ``ident`` left: the engine cancels it; no answer comes."""
        if self.waiting.pop(ident, None) is not None:
            self._write([link_frames.encode_cancel(ident)])

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


def gone_answer(ident: int) -> Answer:
    """The 503 a request gets when the engine is gone."""
    return Answer(
        ident,
        503,
        encode_error(ENGINE_GONE),
        {"Content-Type": "application/json", "Connection": "close"},
    )


def hand_over(channel: socket.socket, sock: socket.socket, data: bytes) -> None:
    """Send ``sock`` and the ``data`` already read from it to the engine.

    ``channel`` is a blocking seqpacket socket (with a send timeout): a hand-over is
    rare (only requests that are not inference) and small. OSError if the engine is gone.
    """
    first = data[:HANDOVER_CHUNK]
    socket.send_fds(channel, [HANDOVER_HEAD.pack(len(data)) + first], [sock.fileno()])
    for at in range(len(first), len(data), HANDOVER_CHUNK):
        channel.sendall(data[at : at + HANDOVER_CHUNK])
