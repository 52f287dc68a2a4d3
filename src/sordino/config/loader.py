"""Reading configuration: YAML file -> overrides -> validation -> one readable ConfigError.

Whatever goes wrong, the caller gets a single :class:`ConfigError` whose message lists
every problem on its own line as ``<dotted.location>: <problem> (got <value>)``, with the
file's line number when the value came from a file. An operator fixes a config file
once, not once per error.

Two conveniences happen before validation:

* Lines written in the brief's arrow form, ``- tag: "premium_user" → priority: "high"``
  (also ``->``), become flow mappings, ``- {tag: "premium_user", priority: "high"}``.
* Relative paths in a file (``server.data_dir``, ``model_repository``, ``models[].path``,
  a model config's ``path``) are taken relative to the file's folder, so a config
  means the same thing whatever the working directory. Overrides are not rewritten.

Messages never echo a secret: the value of a key that names one (``token``,
``secret``, ``password``, ``key``, ``credential``, ``auth``…) and any value that looks
like a credential (an AWS key id, a GitHub or Slack token, a PEM block, a JWT, a URL
with a password, a long random-looking string) is shown as ``<hidden: N characters>``
(:func:`shown_value`), in the ``(got …)`` part and in the problem text alike.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from sordino.config.bounded import check_nesting, dotted_parts, load_yaml
from sordino.config.models import ModelConfig
from sordino.config.runtime import RuntimeConfig
from sordino.config.scheduler import STRATEGY_NAMES
from sordino.errors import ConfigError

__all__ = [
    "load_config",
    "load_model_config_file",
    "looks_secret",
    "secret_key",
    "shown_value",
    "validate_config",
]

_Config = TypeVar("_Config", bound=BaseModel)
_Loc = tuple[str | int, ...]

_KEY = r"[A-Za-z_][\w.-]*"
_VALUE = r"""(?:"(?:[^"\\]|\\.)*"|'(?:[^']|'')*'|[^\s"'#,{}\[\]][^#,{}\[\]]*?)"""
_ARROW_LINE = re.compile(
    rf"^(?P<indent>[ \t]*)-[ \t]+(?P<k1>{_KEY})\s*:\s*(?P<v1>{_VALUE})\s*(?:→|->)\s*"
    rf"(?P<k2>{_KEY})\s*:\s*(?P<v2>{_VALUE})\s*(?P<comment>#.*)?$"
)
_MAX_REPR = 80

_SECRET_KEY = re.compile(
    r"token|secret|passw|pwd|credential|auth|api.?key|access.?key|private.?key|"
    r"(?:^|[_.-])key(?:$|[_.-])|key$|cookie|session",
    re.IGNORECASE,
)
_SECRET_VALUE = re.compile(
    r"""(?:A3T[A-Z0-9]|AKIA|ASIA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA)[A-Z0-9_-]{4,}
      | gh[pousr]_[A-Za-z0-9]{16,} | github_pat_\w{16,}
      | xox[abeprs]-[A-Za-z0-9-]{8,}
      | sk-[A-Za-z0-9_-]{16,}
      | AIza[0-9A-Za-z_-]{20,}
      | -----BEGIN[ A-Z]*PRIVATE\ KEY
      | eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}
      | [A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:[^/\s@]+@
      | \bbearer\s+\S{8,}""",
    re.VERBOSE | re.IGNORECASE,
)
_RANDOM_LOOKING = re.compile(r"[A-Za-z0-9+/=_-]{20,}")


def load_config(
    path: Path | None = None, overrides: Mapping[str, object] | None = None
) -> RuntimeConfig:
    """Read ``path`` (YAML; none means all defaults), apply ``overrides``, and validate.

    ``overrides`` maps dotted keys to values (``{"server.http_port": 0}``); each replaces
    whatever the file set there, which is how command-line flags win over the file.
    Raises :class:`ConfigError` for a missing or unreadable file, a YAML syntax error
    (with its line), or any schema violation (all of them, one per line).
    """
    data: dict[str, object] = {}
    root: yaml.Node | None = None
    if path is not None:
        loaded, root = _read_yaml(path)
        data = _top_level_mapping(loaded, str(path))
        _anchor_paths(data, path.parent)
    for key, value in (overrides or {}).items():
        _set_dotted(data, key, value)
    skip = [tuple(key.split(".")) for key in overrides or {}]
    source = f" in {path}" if path is not None else ""
    return _validate(RuntimeConfig, data, source, root, skip)


def validate_config(data: Mapping[str, object]) -> RuntimeConfig:
    """Validate an already-parsed configuration mapping; raise :class:`ConfigError` if invalid.

    ``data`` is not modified. Used for hot reconfiguration, where the new settings
    arrive as a mapping rather than a file; a mapping nested past the limits of
    :mod:`sordino.config.bounded` is refused before it is copied.
    """
    check_nesting(data, "the configuration")
    return _validate(RuntimeConfig, _top_level_mapping(data, "the configuration"), "", None, [])


def load_model_config_file(path: Path) -> ModelConfig:
    """Read a model repository's per-model ``config.yaml``; raise :class:`ConfigError` if invalid.

    ``name`` and ``path`` may be absent (the repository fills them in from the folder);
    a relative ``path`` is taken relative to the file's folder.
    """
    loaded, root = _read_yaml(path)
    data = _top_level_mapping(loaded, str(path))
    if isinstance(data.get("path"), str):
        data["path"] = _anchored(data["path"], path.parent)
    return _validate(ModelConfig, data, f" in {path}", root, [])


# --- reading ------------------------------------------------------------------------------


def _rewrite_arrows(text: str) -> str:
    """Turn ``- a: x → b: y`` lines into ``- {a: x, b: y}``; every other line is unchanged."""
    lines = text.splitlines(keepends=True)
    for index, line in enumerate(lines):
        if "→" not in line and "->" not in line:
            continue
        body = line.rstrip("\r\n")
        match = _ARROW_LINE.match(body)
        if match is None:
            continue
        comment = f"  {match['comment']}" if match["comment"] else ""
        rewritten = (
            f"{match['indent']}- {{{match['k1']}: {match['v1']}, {match['k2']}: {match['v2']}}}"
        )
        lines[index] = rewritten + comment + line[len(body) :]
    return "".join(lines)


class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping.

    Plain YAML keeps the last value, so the first setting would be silently ignored.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[object] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        "while reading a mapping",
                        node.start_mark,
                        f"found the key {key!r} twice; give each key once",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read_yaml(path: Path) -> tuple[object, yaml.Node | None]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    return load_yaml(_rewrite_arrows(text), str(path), _StrictLoader)


def _top_level_mapping(data: object, source: str) -> dict[str, object]:
    if data is None:
        return {}  # an empty file means "all defaults"
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"the top level of {source} must be a mapping of keys to values, "
            f"got {type(data).__name__}"
        )
    return copy.deepcopy(dict(data))


def _anchored(value: object, base: Path) -> object:
    if (
        isinstance(value, str)
        and value
        and not value.startswith("~")
        and not Path(value).is_absolute()
    ):
        return str(base / value)
    return value


def _anchor_paths(data: dict[str, object], base: Path) -> None:
    server, models = data.get("server"), data.get("models")
    if isinstance(server, dict) and "data_dir" in server:
        server["data_dir"] = _anchored(server["data_dir"], base)
    if "model_repository" in data:
        given = data["model_repository"]
        if isinstance(given, list):
            data["model_repository"] = [_anchored(path, base) for path in given]
        else:
            data["model_repository"] = _anchored(given, base)
    if isinstance(models, list):
        for model in models:
            if isinstance(model, dict) and "path" in model:
                model["path"] = _anchored(model["path"], base)


def _set_dotted(data: dict[str, object], key: str, value: object) -> None:
    """Set ``data[a][b][c] = value`` for ``key == "a.b.c"``; a digit part indexes a list."""
    parts = dotted_parts(key, "override")
    check_nesting(value, f"override {key!r}")
    target: object = data
    for depth, part in enumerate(parts):
        last = depth == len(parts) - 1
        where = ".".join(parts[: depth + 1])
        if isinstance(target, list) and part.isdigit() and int(part) < len(target):
            if last:
                target[int(part)] = copy.deepcopy(value)
                return
            target = target[int(part)]
        elif isinstance(target, dict):
            if last:
                target[part] = copy.deepcopy(value)
                return
            target = target.setdefault(part, {})
        else:
            parent = ".".join(parts[:depth]) or "the top level"
            raise ConfigError(f"override {key!r}: {parent} has no place for {where!r}")


# --- validation and error messages --------------------------------------------------------


def _validate(
    schema: type[_Config],
    data: dict[str, object],
    source: str,
    root: yaml.Node | None,
    overridden: Sequence[tuple[str, ...]],
) -> _Config:
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        problems = [_describe(schema, error, root, overridden) for error in exc.errors()]
        count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
        lines = "\n".join(f"  {problem}" for problem in problems)
        raise ConfigError(f"invalid configuration{source} ({count}):\n{lines}") from None


def secret_key(key: object) -> bool:
    """Whether a key's name says its value is a secret (``admin_token``, ``api_key``…)."""
    return isinstance(key, str) and _SECRET_KEY.search(key) is not None


def looks_secret(value: object) -> bool:
    """Whether ``value`` looks like a credential, whatever key it was found under."""
    if not isinstance(value, str):
        return False
    if _SECRET_VALUE.search(value):
        return True
    # A long random-looking word: mixed case and digits, not a path, high entropy.
    if not _RANDOM_LOOKING.fullmatch(value) or value.startswith(("/", ".", "~")):
        return False
    classes = [any(test(c) for c in value) for test in (str.islower, str.isupper, str.isdigit)]
    return all(classes) and _entropy(value) >= 3.5


def _entropy(text: str) -> float:
    counts = {c: text.count(c) for c in set(text)}
    return -sum(n / len(text) * math.log2(n / len(text)) for n in counts.values())


def _hidden(value: object) -> str:
    if isinstance(value, str):
        return f"<hidden: {len(value)} characters>"
    return "<hidden>"


class _Hidden:
    """Stands for a secret in a value shown by ``repr``: ``<hidden: N characters>``."""

    def __init__(self, value: object) -> None:
        self._text = _hidden(value)

    def __repr__(self) -> str:
        return self._text


def _redacted(value: object, secret: bool = False) -> object:
    """``value`` with every secret (by key or by look) replaced by a placeholder."""
    if secret or looks_secret(value):
        return _Hidden(value)
    if isinstance(value, Mapping):
        return {k: _redacted(v, secret_key(k)) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_redacted(v) for v in value)
    return value


def _secrets_in(value: object, secret: bool = False) -> list[str]:
    """The secret strings inside ``value`` (by key or by look), longest first."""
    if isinstance(value, str):
        return [value] if secret or looks_secret(value) else []
    found: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            found += _secrets_in(v, secret or secret_key(k))
    elif isinstance(value, list | tuple):
        for v in value:
            found += _secrets_in(v, secret)
    return sorted(found, key=len, reverse=True)


def shown_value(value: object, *, key: object = None) -> str:
    """``repr(value)`` for a message, shortened, with secrets hidden (see the module doc)."""
    return _short_repr(_redacted(value, secret_key(key)))


def _describe(
    schema: type[BaseModel],
    error: ErrorDetails,
    root: yaml.Node | None,
    overridden: Sequence[tuple[str, ...]],
) -> str:
    """Format one pydantic error as ``location: problem (got value)[ [line N]]``."""
    text = _describe_plain(schema, error, root, overridden)
    secret = any(secret_key(part) for part in error["loc"])
    for hidden in _secrets_in(error["input"], secret):
        text = text.replace(repr(hidden), _hidden(hidden))
        if len(hidden) >= 6:  # a shorter one could match parts of ordinary words
            text = text.replace(hidden, _hidden(hidden))
    return text


def _describe_plain(
    schema: type[BaseModel],
    error: ErrorDetails,
    root: yaml.Node | None,
    overridden: Sequence[tuple[str, ...]],
) -> str:
    kind, raw_loc = error["type"], tuple(error["loc"])
    loc, _ = _resolve(schema, raw_loc)
    dotted = ".".join(str(part) for part in loc)
    secret = any(secret_key(part) for part in raw_loc)
    got: str | None = _short_repr(_redacted(error["input"], secret))
    if kind == "extra_forbidden":
        parent_loc, section = _resolve(schema, raw_loc[:-1])
        loc = (*parent_loc, raw_loc[-1])
        dotted = ".".join(str(part) for part in loc)
        problem, got = _unknown_key(dotted, str(raw_loc[-1]), section), None
    elif kind == "missing":
        problem, got = f"missing required key '{raw_loc[-1]}'", None
    elif kind in ("union_tag_invalid", "union_tag_not_found"):
        tag = error.get("ctx", {}).get("tag")
        problem = f"unknown strategy name {tag!r}" if tag is not None else "missing key 'name'"
        problem += f"; valid names: {', '.join(STRATEGY_NAMES)}"
        got = _short_repr(_redacted(tag)) if tag is not None else None
    else:
        problem = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if not loc:
        # A check across sections: its message names the keys; the input is the whole file.
        return problem
    text = f"{dotted}: {problem}" + (f" (got {got})" if got is not None else "")
    as_text = tuple(str(part) for part in loc)
    if root is not None and not any(as_text[: len(key)] == key for key in overridden):
        line = _line_of(root, loc)
        if line is not None:
            text += f" [line {line}]"
    return text


def _unknown_key(dotted: str, key: str, section: type[BaseModel] | None) -> str:
    if section is None:
        return f"unknown key '{dotted}'"
    valid = [*section.model_fields, *getattr(section, "triton_aliases", ())]
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" — did you mean '{close[0]}'?" if close else ""
    return f"unknown key '{dotted}'{hint} (valid keys: {', '.join(valid)})"


def _short_repr(value: object) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 1] + "…"


def _leaves(annotation: object) -> list[object]:
    """Flatten ``Annotated`` and unions into the plain types they are made of."""
    origin = get_origin(annotation)
    if origin is Annotated:
        return _leaves(get_args(annotation)[0])
    if origin is Union or origin is UnionType:
        return [leaf for arg in get_args(annotation) for leaf in _leaves(arg)]
    return [annotation]


def _tag(model: type[BaseModel]) -> object:
    field = model.model_fields.get("name")
    if field is not None and get_origin(field.annotation) is Literal:
        return get_args(field.annotation)[0]
    return None


def _resolve(schema: type[BaseModel], loc: _Loc) -> tuple[_Loc, type[BaseModel] | None]:
    """Return ``loc`` without union tags, and the schema section found at its end (if any).

    pydantic puts a discriminated union's tag into the location (``strategies.0.
    dynamic_batching.max_batch``); it is not a key anybody wrote, so it is dropped.
    """
    shown: list[str | int] = []
    current: object = schema
    for part in loc:
        leaves = _leaves(current)
        models = [leaf for leaf in leaves if isinstance(leaf, type) and issubclass(leaf, BaseModel)]
        if isinstance(part, int):
            sequences = [leaf for leaf in leaves if get_origin(leaf) in (tuple, list)]
            current = get_args(sequences[0])[0] if sequences else None
        elif len(models) > 1 and any(_tag(model) == part for model in models):
            current = next(model for model in models if _tag(model) == part)
            continue
        else:
            owner = next((model for model in models if part in model.model_fields), None)
            current = owner.model_fields[part].annotation if owner else None
        shown.append(part)
    models = [leaf for leaf in _leaves(current) if isinstance(leaf, type)]
    section = next((leaf for leaf in models if issubclass(leaf, BaseModel)), None)
    return tuple(shown), section


def _line_of(node: yaml.Node, loc: _Loc) -> int | None:
    """Return the 1-based line of the deepest part of ``loc`` present in the YAML tree."""
    line = None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            entry = next((pair for pair in node.value if pair[0].value == str(part)), None)
            if entry is None:
                return line
            line, node = entry[0].start_mark.line + 1, entry[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                return line
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            return line
    return line
