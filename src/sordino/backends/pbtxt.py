"""Triton's ``config.pbtxt``: protobuf text format read into Triton's JSON form.

Triton hands a Python model its configuration as JSON (``args["model_config"]``):
the ``ModelConfig`` message with its field names, enums as their names
(``"TYPE_FP32"``), 64-bit integers as numbers, repeated fields as lists and map fields
(``parameters``) as objects. :func:`parse_pbtxt` gives that form straight from the
text, without Triton's ``.proto``: the text format says everything but which fields
are repeated, so the repeated fields of ``ModelConfig`` are listed here
(:data:`REPEATED`), and a field given twice becomes a list too.

:func:`sordino.backends.pbtxt_settings.sordino_settings` picks what ``ModelConfig``
(sordino's) takes from it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from sordino.errors import ConfigError, ModelLoadError

__all__ = ["REPEATED", "parse_pbtxt", "parse_triton_json", "read_pbtxt"]

REPEATED = frozenset(
    {
        "input",
        "output",
        "dims",
        "shape",
        "instance_group",
        "gpus",
        "preferred_batch_size",
        "batch_input",
        "batch_output",
        "source_input",
        "control_input",
        "control",
        "state",
        "step",
        "secondary_devices",
        "profile",
        "label_filename",
        "allowed_values",
        "int32_false_true",
        "fp32_false_true",
        "bool_false_true",
        "model_warmup",
        "gpu_execution_accelerator",
        "cpu_execution_accelerator",
        "versions",
        "model_transaction_policy_values",
        "agents",
    }
)
"""Repeated fields of Triton's ``ModelConfig`` (and the messages inside it)."""

_MAPS = frozenset(
    {
        "parameters",
        "input_map",
        "output_map",
        "priority_queue_policy",
        "inputs",
    }  # inputs: model_warmup's
)
"""Map fields: written as repeated ``{ key: ... value: ... }`` entries."""

_TOKEN = re.compile(
    r"""\s*(?:
        (?P<comment>\#[^\n]*)
      | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
      | (?P<number>[-+]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)[fF]?)
      | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
      | (?P<punct>[{}\[\]:,;<>])
    )""",
    re.VERBOSE,
)


def _tokens(text: str, source: str) -> list[tuple[str, str, int]]:
    tokens: list[tuple[str, str, int]] = []
    pos = 0
    text = text.rstrip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            pos += len(text[pos:]) - len(text[pos:].lstrip())  # point at the character
            line = text.count("\n", 0, pos) + 1
            raise ConfigError(f"{source}: line {line}: cannot read {text[pos : pos + 20]!r}")
        kind = match.lastgroup or ""
        if kind != "comment":
            tokens.append((kind, match.group(kind), text.count("\n", 0, match.start(kind)) + 1))
        pos = match.end()
    return tokens


class _Reader:
    def __init__(self, tokens: list[tuple[str, str, int]], source: str) -> None:
        self._tokens = tokens
        self._at = 0
        self._source = source

    def _fail(self, what: str) -> ConfigError:
        line = self._tokens[min(self._at, len(self._tokens) - 1)][2] if self._tokens else 1
        return ConfigError(f"{self._source}: line {line}: {what}")

    def _peek(self) -> tuple[str, str, int] | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _next(self) -> tuple[str, str, int]:
        token = self._peek()
        if token is None:
            raise self._fail("the file ends inside a message")
        self._at += 1
        return token

    def message(self, closing: str | None) -> dict[str, Any]:
        fields: dict[str, Any] = {}
        while True:
            token = self._peek()
            if token is None:
                if closing is not None:
                    raise self._fail(f"missing {closing!r}")
                return fields
            if token[0] == "punct" and token[1] in ("}", ">"):
                if closing != token[1]:
                    raise self._fail(f"unexpected {token[1]!r}")
                self._at += 1
                return fields
            if token[0] == "punct" and token[1] in (",", ";"):
                self._at += 1
                continue
            kind, name, _ = self._next()
            if kind != "word":
                raise self._fail(f"expected a field name, found {name!r}")
            self._field(fields, name)

    def _field(self, fields: dict[str, Any], name: str) -> None:
        token = self._peek()
        if token is not None and token[1] == ":":
            self._at += 1
            token = self._peek()
        if token is not None and token[1] == "[":
            self._at += 1
            values: list[Any] = []
            while True:
                if self._peek() is not None and self._peek()[1] == "]":  # type: ignore[index]
                    self._at += 1
                    break
                values.append(self._value())
                if self._peek() is not None and self._peek()[1] == ",":  # type: ignore[index]
                    self._at += 1
            for value in values:
                _add(fields, name, value)
            if not values:
                fields.setdefault(name, [] if name not in _MAPS else {})
            return
        _add(fields, name, self._value())

    def _value(self) -> Any:
        kind, text, _ = self._next()
        if kind == "punct" and text in ("{", "<"):
            return self.message("}" if text == "{" else ">")
        if kind == "string":
            parts = [text]
            while self._peek() is not None and self._peek()[0] == "string":  # type: ignore[index]
                parts.append(self._next()[1])
            return "".join(_unquote(p) for p in parts)
        if kind == "number":
            return _number(text)
        if kind == "word":
            if text in ("true", "True"):
                return True
            if text in ("false", "False"):
                return False
            return text  # an enum value, by name
        raise self._fail(f"expected a value, found {text!r}")


def _unquote(text: str) -> str:
    body = text[1:-1]
    return body.encode("latin-1", "backslashreplace").decode("unicode_escape")


def _number(text: str) -> int | float:
    text = text.rstrip("fF") if not text.lower().startswith(("0x", "-0x")) else text
    try:
        return int(text, 0)
    except ValueError:
        return float(text)


def _add(fields: dict[str, Any], name: str, value: Any) -> None:
    if name in _MAPS:
        if not isinstance(value, dict) or "key" not in value:
            raise ConfigError(f"map field {name} needs {{ key: ... value: ... }} entries")
        fields.setdefault(name, {})[str(value["key"])] = value.get("value")
    elif name in REPEATED:
        fields.setdefault(name, []).append(value)
    elif name in fields:
        previous = fields[name]
        fields[name] = [*previous, value] if isinstance(previous, list) else [previous, value]
    else:
        fields[name] = value


def parse_pbtxt(text: str, *, source: str = "config.pbtxt") -> dict[str, Any]:
    """Triton's JSON form of the ``ModelConfig`` in ``text``; ConfigError naming the line."""
    return _Reader(_tokens(text, source), source).message(None)


def read_pbtxt(path: Path) -> dict[str, Any]:
    """:func:`parse_pbtxt` of the file ``path`` (ModelLoadError when it cannot be read)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ModelLoadError(f"{path}: cannot read it: {exc}") from exc
    return parse_pbtxt(text, source=str(path))


def parse_triton_json(text: str, *, source: str) -> dict[str, Any]:
    """The ``ModelConfig`` in ``text``, Triton's JSON form of it (what ``GET …/config``
    answers, and a model-control load's ``config`` parameter gives): field names as
    :func:`parse_pbtxt` gives them, protobuf's lowerCamelCase ones (``maxBatchSize``)
    read as theirs; ConfigError saying what is wrong."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise ConfigError(f"{source} is not JSON: {exc}") from None
    if not isinstance(document, dict):
        raise ConfigError(f"{source} must be a JSON object (a model configuration)")
    converted = _snake_case(document, in_map=False)
    assert isinstance(converted, dict)
    return converted


def _snake_case(value: Any, *, in_map: bool) -> Any:
    """``value`` with its field names in snake case (a map's keys are names: kept)."""
    if isinstance(value, list):
        return [_snake_case(item, in_map=False) for item in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = key if in_map else _CAMEL.sub(lambda m: "_" + m.group(0).lower(), str(key))
        out[name] = _snake_case(item, in_map=not in_map and name in _MAPS)
    return out


_CAMEL = re.compile(r"(?<=[a-z0-9])[A-Z]")
