"""An ONNX file's ``metadata_props``, read and rewritten without the ``onnx`` package.

An ONNX model is a protobuf ``ModelProto``; ``metadata_props`` is its repeated field 14
of ``StringStringEntryProto`` (``key`` = 1, ``value`` = 2). Serving needs only
ONNX Runtime, so runtime hints are read here from the wire format: the top-level
fields are walked (the graph is skipped by its length, never decoded), and a rewrite
copies every other field's bytes as they are and appends the new entries (protobuf
allows fields in any order).
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator, Mapping
from pathlib import Path

from sordino.errors import ModelLoadError

__all__ = ["read_props", "write_props"]

_METADATA_PROPS = 14


def _varint(data: bytes | mmap.mmap, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes | mmap.mmap) -> Iterator[tuple[int, int, int, int, int]]:
    """(field number, wire type, start of the field, start of its value, end) for each field."""
    pos = 0
    while pos < len(data):
        start = pos
        tag, pos = _varint(data, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 0:
            _, end = _varint(data, pos)
            value = pos
        elif wire == 1:
            value, end = pos, pos + 8
        elif wire == 2:
            length, value = _varint(data, pos)
            end = value + length
        elif wire == 5:
            value, end = pos, pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        if end > len(data):
            raise ValueError("truncated field")
        yield number, wire, start, value, end
        pos = end


def _entry(data: bytes) -> tuple[str, str]:
    key = value = ""
    for number, wire, _, start, end in _fields(data):
        if wire == 2 and number == 1:
            key = data[start:end].decode("utf-8")
        elif wire == 2 and number == 2:
            value = data[start:end].decode("utf-8")
    return key, value


def read_props(path: Path) -> dict[str, str]:
    """The ``metadata_props`` of the ONNX file at ``path``."""
    try:
        with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            props: dict[str, str] = {}
            for number, wire, _, start, end in _fields(data):
                if number == _METADATA_PROPS and wire == 2:
                    key, value = _entry(bytes(data[start:end]))
                    props[key] = value
            return props
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{path} is not an ONNX model (cannot read it): {exc}") from None


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _encode_field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def write_props(source: Path, target: Path, props: Mapping[str, str], *, replace: str) -> None:
    """Copy ``source`` to ``target`` without the entries whose key starts with ``replace``,
    then with ``props`` appended."""
    data = source.read_bytes()
    try:
        kept = bytearray()
        for number, wire, start, value, end in _fields(data):
            if number == _METADATA_PROPS and wire == 2:
                key, _ = _entry(data[value:end])
                if key.startswith(replace):
                    continue
            kept += data[start:end]
    except (ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(f"{source} is not an ONNX model (cannot read it): {exc}") from None
    for key, text in props.items():
        entry = _encode_field(1, key.encode()) + _encode_field(2, text.encode())
        kept += _encode_field(_METADATA_PROPS, entry)
    target.write_bytes(bytes(kept))
