"""Compressed inference over HTTP: gzip and deflate request bodies and answers.

tritonclient's ``infer(..., request_compression_algorithm="gzip" | "deflate")`` sends
the body compressed with ``Content-Encoding``, and ``response_compression_algorithm``
asks for a compressed answer with ``Accept-Encoding``; Triton takes both on
``…/infer``. Here:

- :func:`inflate`: a request body in ``gzip``, ``x-gzip`` or ``deflate`` (zlib's
  format, as tritonclient and browsers send it; a raw deflate stream is taken too),
  back to the body it was, never past ``server.max_request_size`` (a body that
  inflates past it is 413, as a plain one that large: no decompression bomb). A body
  that is not what its coding says is 400; another coding is refused, naming those
  taken.
- :func:`accepted` and :func:`compress`: an inference answer is compressed when the
  request's ``Accept-Encoding`` names ``gzip`` or ``deflate`` with a non-zero
  ``q`` (the higher ``q`` first, then the order given), with ``Content-Encoding`` set;
  error answers and every other endpoint are sent as they are.

The ``zlib`` module (the standard library's binding of zlib) does the work.
"""

from __future__ import annotations

import zlib

from sordino.errors import MalformedBody, Unsupported

__all__ = ["accepted", "coded", "compress", "inflate"]

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def inflate(body: bytes, coding: str, limit: int) -> bytes:
    """``body`` decoded from its ``Content-Encoding`` ``coding``; at most ``limit`` bytes."""
    name = coding.strip().lower()
    if name in ("", "identity"):
        return body
    wbits = _WBITS.get(name)
    if wbits is None:
        raise Unsupported(
            f"Content-Encoding {coding!r} is not supported: send the body as it is, or "
            "compressed with gzip or deflate"
        )
    try:
        return _inflate(body, wbits, limit)
    except zlib.error:
        if name != "deflate":
            raise _not(coding) from None
    try:  # a raw deflate stream (no zlib header), as some clients send "deflate"
        return _inflate(body, -zlib.MAX_WBITS, limit)
    except zlib.error:
        raise _not(coding) from None


def _inflate(body: bytes, wbits: int, limit: int) -> bytes:
    """``body`` inflated: a gzip body may be several members one after another (RFC
    1952), each inflated in turn; bytes after a deflate stream are an error."""
    parts: list[bytes] = []
    size = 0
    rest = body
    while True:
        decoder = zlib.decompressobj(wbits)
        data = decoder.decompress(rest, limit - size + 1)
        size += len(data)
        if size > limit or decoder.unconsumed_tail:
            raise MalformedBody(
                f"the request body inflates past the limit of {limit} bytes; send less "
                "data per request or raise server.max_request_size",
                too_large=True,
            )
        if not decoder.eof:
            raise zlib.error("truncated")
        parts.append(data)
        rest = decoder.unused_data
        if not rest:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        if wbits != _WBITS["gzip"]:
            raise zlib.error("bytes after the end of the compressed data")


def _not(coding: str) -> MalformedBody:
    return MalformedBody(
        f"the request body is not {coding} data (its Content-Encoding): send it compressed "
        "as the header says, or without the header"
    )


def accepted(accept: str) -> str | None:
    """The coding to answer in for an ``Accept-Encoding`` value: ``gzip`` or
    ``deflate``, else None (the answer as it is)."""
    best: tuple[float, int, str] | None = None
    for order, item in enumerate(accept.split(",")):
        name, _, rest = item.partition(";")
        name = name.strip().lower()
        if name not in ("gzip", "x-gzip", "deflate"):
            continue
        q = 1.0
        key, _, value = rest.strip().partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value)
            except ValueError:
                continue
        if q > 0 and (best is None or q > best[0]):
            best = (q, order, "gzip" if name == "x-gzip" else name)
    return None if best is None else best[2]


def compress(payload: bytes, headers: dict[str, str], coding: str) -> tuple[bytes, dict[str, str]]:
    """``payload`` compressed in ``coding`` (:func:`accepted`'s), with its headers."""
    encoder = zlib.compressobj(wbits=_WBITS[coding])
    data = encoder.compress(payload) + encoder.flush()
    return data, {**headers, "Content-Encoding": coding}


def coded(
    facts: dict[str, str], payload: bytes, headers: dict[str, str]
) -> tuple[bytes, dict[str, str]]:
    """An inference answer compressed as the request's ``Accept-Encoding`` (among
    ``facts``, the headers ``fast_infer.parse_headers`` keeps) asks, else as it is."""
    accept = facts.get("accept-encoding")
    coding = None if accept is None else accepted(accept)
    return (payload, headers) if coding is None else compress(payload, headers, coding)
