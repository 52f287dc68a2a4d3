"""A request that proposes another protocol (``Upgrade``), served as the HTTP/1.1 it is.

sordino switches to no other protocol (no ``h2c``, no WebSocket) and, as RFC 9110 §7.8
allows, answers such a request on the connection's own protocol, body and all. The
HTTP parser (llhttp, through httptools) treats it otherwise: it ends an upgrade request
at its headers — the body is not parsed and ``on_message_complete`` comes at once — and
stops at the first byte after the headers, which it leaves to the new protocol. So
``curl --http2 -d @request.json http://…/infer``, which proposes ``h2c`` on every
request, was answered "the request body is not valid JSON: … empty document", and the
body's bytes were then read as the next request.

:class:`IgnoredUpgrade` (part of ``server/http_protocol.py``'s protocol) undoes that:
the protocol's ``on_message_complete`` asks :meth:`IgnoredUpgrade._body_skipped` first,
which, for an upgrade request that has a body (a ``Content-Length`` or
``Transfer-Encoding``), keeps the request open; when the parser then stops,
:meth:`IgnoredUpgrade._ignore_upgrade` gives the connection a new parser, fed the
request's framing headers again and then the bytes the old one left: the body reaches
the request as any body does (``on_body``, the deadlines, the limits), its end ends it,
and what follows on the connection is parsed as usual. A proposal without a body needs
only the bytes after it parsed again.
"""

from __future__ import annotations

from typing import Any

import httptools

__all__ = ["IgnoredUpgrade"]

_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


class IgnoredUpgrade:
    """The protocol's side of an ``Upgrade`` it does not follow (see the module)."""

    parser: Any
    headers: list[tuple[bytes, bytes]]
    _resume: bytes | None = None  # the framing head that parses the skipped body again

    def _bad_request(self, message: str) -> None:
        raise NotImplementedError  # the protocol's

    def _body_skipped(self) -> bool:
        """At ``on_message_complete`` of an upgrade request: whether the parser skipped
        a body, which is then read by the next parser (the request stays open)."""
        framing = [(name, value) for name, value in self.headers if name in _FRAMING]
        if not framing:
            return False
        lines = b"".join(b"%s: %s\r\n" % pair for pair in framing)
        self._resume = b"POST / HTTP/1.1\r\n" + lines + b"\r\n"
        return True

    def _ignore_upgrade(self, data: bytes, offset: int) -> None:
        """The parser stopped at ``data[offset]`` for an upgrade: parse on as HTTP/1.1."""
        while True:
            rest = data[offset:]
            resume, self._resume = self._resume, None
            if resume is not None:
                self.parser = httptools.HttpRequestParser(_Resumed(self))
                self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
                rest = resume + rest
            if not rest:
                return
            try:
                self.parser.feed_data(rest)
                return
            except httptools.HttpParserUpgrade as upgrade:  # another one, pipelined
                data, offset = rest, upgrade.args[0]
            except httptools.HttpParserError:
                self._bad_request("Invalid HTTP request received.")
                return


class _Resumed:
    """A parser's callbacks after an ignored upgrade with a body: its first message is
    the framing head written again, so of it only the body and the end reach the
    protocol (the request was begun by the parser before); every later message reaches
    it whole."""

    __slots__ = ("_again", "_protocol")

    def __init__(self, protocol: Any) -> None:
        self._protocol = protocol
        self._again = True

    def on_message_begin(self) -> None:
        if not self._again:
            self._protocol.on_message_begin()

    def on_url(self, url: bytes) -> None:
        if not self._again:
            self._protocol.on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._again:
            self._protocol.on_header(name, value)

    def on_headers_complete(self) -> None:
        if not self._again:
            self._protocol.on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._protocol.on_body(body)

    def on_message_complete(self) -> None:
        self._again = False
        self._protocol.on_message_complete()
