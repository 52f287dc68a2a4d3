"""Limits on documents that clients and operators hand in: YAML, nesting, dotted keys.

Every YAML text sordino reads from outside (configuration files, ``reconfigure
--file``, ``--set`` values, strategy bundles, load profiles, findings) goes through
:func:`load_yaml`, and every dotted key (``--set``, start-up overrides, the
reconfigure API) through :func:`dotted_parts`. Configuration is small: a few
kilobytes, a handful of levels deep. What is far past that is refused with a message
saying what was too big, before any of it is built:

* a YAML text over :data:`MAX_YAML_BYTES`;
* a document whose aliases would expand to more than :data:`MAX_NODES` values (the
  "billion laughs": a few hundred bytes of ``&a [*b, *b, …]`` that becomes gigabytes
  once anything walks it), that refers to itself, or is nested deeper than
  :data:`MAX_DEPTH`;
* a dotted key longer than :data:`MAX_KEY_LENGTH` characters or with more than
  :data:`MAX_KEY_PARTS` parts, or with an empty part (``a..b``).

The checks walk the document with an explicit stack, never by recursion, so a deep
document cannot exhaust Python's recursion limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from sordino.errors import ConfigError

__all__ = [
    "MAX_DEPTH",
    "MAX_KEY_LENGTH",
    "MAX_KEY_PARTS",
    "MAX_NODES",
    "MAX_YAML_BYTES",
    "check_nesting",
    "dotted_parts",
    "load_yaml",
]

MAX_YAML_BYTES = 1024 * 1024
"""The largest YAML text read (1 MiB; a large configuration is a few tens of KiB)."""
MAX_NODES = 100_000
"""The most values (mappings, lists and scalars, aliases counted expanded) in a document."""
MAX_DEPTH = 32
"""The deepest nesting of mappings and lists (the schema itself is at most ~7 deep)."""
MAX_KEY_LENGTH = 256
"""The longest dotted key, in characters."""
MAX_KEY_PARTS = 16
"""The most parts of a dotted key (``models.NAME.dynamic_batching.…`` has 5)."""


def load_yaml(
    text: str, source: str, loader: type[yaml.SafeLoader] = yaml.SafeLoader
) -> tuple[Any, yaml.Node | None]:
    """Parse ``text`` (from ``source``, named in messages) within the limits above.

    Returns the document and its node tree (None for an empty text). Raises
    :class:`ConfigError` for a text or document past a limit and for a YAML syntax
    error (with its line and column). ``loader`` must be a ``SafeLoader``.
    """
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_YAML_BYTES:
        raise ConfigError(
            f"{source} is {size} bytes; YAML read by sordino is at most {MAX_YAML_BYTES} bytes"
        )
    reader = loader(text)
    try:
        root = reader.get_single_node()
        if root is None:
            return None, None
        _check_nodes(root, source)
        return reader.construct_document(root), root
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise ConfigError(f"YAML error in {source}{where}: {problem}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"YAML error in {source}: {exc}") from None
    finally:
        reader.dispose()


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def _check_nodes(root: yaml.Node, source: str) -> None:
    """Refuse a node graph that expands past MAX_NODES, nests past MAX_DEPTH, or loops.

    An alias is the same node object reached twice, so the expanded size of a node is
    worked out once (memoised by identity) in a post-order walk on an explicit stack.
    """
    expanded: dict[int, int] = {}
    height: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        if children_done:
            on_path.discard(key)
            children = _children(node)
            expanded[key] = 1 + sum(expanded[id(child)] for child in children)
            height[key] = 1 + max((height[id(child)] for child in children), default=0)
            if expanded[key] > MAX_NODES:
                raise ConfigError(
                    f"{source} expands to more than {MAX_NODES} values (YAML aliases that "
                    "repeat large parts); write the document out, or use fewer aliases"
                )
            if height[key] > MAX_DEPTH:
                raise ConfigError(f"{source} is nested more than {MAX_DEPTH} levels deep")
            continue
        if key in expanded:
            continue
        if key in on_path:
            raise ConfigError(f"{source} has a YAML alias that refers to itself")
        on_path.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if id(child) not in expanded)


def check_nesting(value: object, what: str) -> None:
    """Raise :class:`ConfigError` when ``value`` (parsed JSON or YAML) nests too deep or big.

    Mappings and lists count as levels; the walk uses an explicit stack.
    """
    stack: list[tuple[object, int]] = [(value, 1)]
    count = 0
    while stack:
        item, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise ConfigError(f"{what} has more than {MAX_NODES} values")
        if isinstance(item, Mapping):
            children: list[object] = [*item.keys(), *item.values()]
        elif isinstance(item, list | tuple):
            children = list(item)
        else:
            continue
        if depth > MAX_DEPTH:
            raise ConfigError(f"{what} is nested more than {MAX_DEPTH} levels deep")
        stack.extend((child, depth + 1) for child in children)


def dotted_parts(key: str, what: str = "key") -> list[str]:
    """The parts of a dotted key such as ``server.http_port``; ConfigError when malformed.

    ``what`` names the key in the message (``--set``, ``override``…). A key longer
    than :data:`MAX_KEY_LENGTH`, with more than :data:`MAX_KEY_PARTS` parts, or with an
    empty part is refused; the message shows at most the key's first 60 characters.
    """
    shown = key if len(key) <= 60 else f"{key[:60]}… ({len(key)} characters)"
    example = "a dotted key such as 'scheduler.mode' or 'models.NAME.max_batch_size'"
    if len(key) > MAX_KEY_LENGTH:
        raise ConfigError(
            f"{what} {shown!r} is too long: at most {MAX_KEY_LENGTH} characters; give {example}"
        )
    parts = key.split(".")
    if len(parts) > MAX_KEY_PARTS:
        raise ConfigError(
            f"{what} {shown!r} has {len(parts)} parts: at most {MAX_KEY_PARTS}; give {example}"
        )
    if not all(part.strip() for part in parts):
        raise ConfigError(f"{what} {shown!r} has an empty part; give {example}")
    return parts
