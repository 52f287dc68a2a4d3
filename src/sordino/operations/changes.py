"""What a configuration change is: documents, assignments, diffs, and what may change live.

A configuration *document* is the JSON form of the effective configuration: the
``RuntimeConfig`` sections, with ``models`` a mapping of model name to that model's
configuration (every loaded model, built-ins included), so ``models.NAME.KEY`` names
one model's key. A change is an overlay (a partial document) and dotted assignments
(``--set KEY=VALUE``) applied on top of the live document; :func:`diff` lists the
leaves that differ and :func:`is_live` says which of them the running server can take
without a restart.
"""

from __future__ import annotations

import copy
import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sordino.config.bounded import check_nesting, dotted_parts, load_yaml
from sordino.errors import ConfigError, InvalidRequest

__all__ = [
    "LIVE_KEYS",
    "Change",
    "apply_assignments",
    "check_change",
    "deep_merge",
    "diff",
    "flatten",
    "is_live",
    "models_by_name",
    "parse_assignment",
    "restart_reason",
    "strategies_as_list",
]

Document = dict[str, Any]

LIVE_KEYS: tuple[str, ...] = (
    "scheduler.mode",
    "scheduler.slo_p99_ms",
    "scheduler.strategies.dynamic_batching.*",
    "memory.pool_size",
    "memory.defrag_interval",
    "memory.defrag_threshold",
    "memory.defrag_window",
    "memory.compact_step",
    "reconfigure.*",
    "models.*.max_batch_size",
    "models.*.scheduler_mode",
    "models.*.dynamic_batching.preferred_batch_size",
    "models.*.dynamic_batching.max_queue_delay_microseconds",
    "models.*.dynamic_batching.min_batch_size",
    "models.*.dynamic_batching.max_batch",
    "models.*.dynamic_batching.default_priority_level",
    "models.*.dynamic_batching.default_queue_policy.*",
)
"""Keys (glob patterns over dotted keys) a running server applies without a restart."""

_ALIASES = {"max_batch": "max_batch_size"}
"""Short spellings accepted in ``models.NAME.KEY`` assignments (the issue's ``max_batch``)."""


@dataclass(frozen=True, slots=True)
class Change:
    """One leaf of the configuration that differs: its dotted key, old and new values."""

    key: str
    old: Any
    new: Any

    @property
    def live(self) -> bool:
        return is_live(self.key)

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"key": self.key, "old": self.old, "new": self.new}
        document["live"] = self.live
        if not self.live:
            document["why"] = restart_reason(self.key)
        return document


def is_live(key: str) -> bool:
    """Whether the leaf ``key`` can change while the server runs."""
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in LIVE_KEYS)


def restart_reason(key: str) -> str:
    """Why ``key`` needs a restart (or a model reload), in a few words."""
    head = key.split(".", 1)[0]
    if key.startswith("models."):
        return "it changes how the model is loaded: reload it (sordino models load NAME)"
    if head == "server":
        return "listeners, TLS, the token and the data dir are set up once at start-up"
    if key.startswith("scheduler.strategies"):
        return "only the dynamic_batching strategy changes live"
    return f"the {head} section is read once at start-up"


def parse_assignment(text: str) -> tuple[str, Any]:
    """``"KEY=VALUE"`` -> ``(key, value)``; the value is read as a YAML scalar or list."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    if not sep or not key:
        shown = text if len(text) <= 60 else f"{text[:60]}…"
        raise InvalidRequest(
            f"--set {shown!r} is not KEY=VALUE with a dotted key, e.g. --set scheduler.mode=manual"
        )
    try:
        dotted_parts(key, "--set")
    except ConfigError as exc:
        raise InvalidRequest(str(exc)) from None
    try:
        value = load_yaml(raw, f"the value of --set {key}")[0] if raw.strip() else ""
    except ConfigError as exc:
        if "YAML error" not in str(exc):
            raise InvalidRequest(str(exc)) from None
        value = raw  # not YAML: taken as the plain string it is
    return key, value


def models_by_name(models: object) -> dict[str, Any]:
    """A ``models`` value as a mapping by name: a list of entries (a file) or a mapping."""
    if models is None:
        return {}
    if isinstance(models, Mapping):
        return {str(name): copy.deepcopy(entry) for name, entry in models.items()}
    if isinstance(models, list):
        named: dict[str, Any] = {}
        for index, entry in enumerate(models):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                raise InvalidRequest(f"models[{index}] needs a name to say which model it changes")
            named[entry["name"]] = {k: copy.deepcopy(v) for k, v in entry.items() if k != "name"}
        return named
    raise InvalidRequest(f"models must be a list or a mapping by name, got {type(models).__name__}")


def check_change(overlay: Mapping[str, Any], assignments: Mapping[str, Any]) -> None:
    """Raise :class:`InvalidRequest` for an overlay or assignments past the limits of
    :mod:`sordino.config.bounded` (nesting, size, malformed dotted keys)."""
    try:
        check_nesting(overlay, "the configuration overlay")
        check_nesting(assignments, "the assignments")
        for key in assignments:
            dotted_parts(key, "--set")
    except ConfigError as exc:
        raise InvalidRequest(str(exc)) from None


def deep_merge(base: Mapping[str, Any], overlay: Mapping[str, Any]) -> Document:
    """``base`` with ``overlay`` on top: mappings merge key by key, anything else replaces."""
    merged: Document = copy.deepcopy(dict(base))
    for key, value in overlay.items():
        if key == "models":
            value = models_by_name(value)
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def apply_assignments(document: Mapping[str, Any], assignments: Mapping[str, Any]) -> Document:
    """``document`` with each dotted key set; ``models.NAME`` must name a known model."""
    result: Document = copy.deepcopy(dict(document))
    for key, value in assignments.items():
        try:
            parts = dotted_parts(key, "--set")
            check_nesting(value, f"the value of --set {key}")
        except ConfigError as exc:
            raise InvalidRequest(str(exc)) from None
        if parts[0] == "models":
            known = result.get("models") or {}
            if len(parts) < 3:
                raise InvalidRequest(f"--set {key}: name a model and a key, models.NAME.KEY")
            if parts[1] not in known:
                names = ", ".join(sorted(known)) or "none"
                raise InvalidRequest(
                    f"--set {key}: no model {parts[1]!r} is served (served: {names})"
                )
            parts[2] = _ALIASES.get(parts[2], parts[2])
        if parts[0] == "scheduler" and len(parts) > 2 and parts[1] == "dynamic_batching":
            parts = ["scheduler", "strategies", "dynamic_batching", *parts[2:]]
        _set(result, parts, value, key)
    return result


def _set(document: Document, parts: list[str], value: Any, key: str) -> None:
    target: Any = document
    for depth, part in enumerate(parts[:-1]):
        if parts[: depth + 1] == ["scheduler", "strategies"]:
            target = _strategies_by_name(target)
        nxt = target.get(part) if isinstance(target, dict) else None
        if nxt is None and isinstance(target, dict):
            nxt = target[part] = {}
        if not isinstance(nxt, dict):
            where = ".".join(parts[: depth + 1])
            raise InvalidRequest(f"--set {key}: {where} is a value, not a section")
        target = nxt
    target[parts[-1]] = copy.deepcopy(value)


def _strategies_by_name(scheduler: Document) -> Document:
    """Turn ``scheduler.strategies`` into a mapping by name in place (for assignments)."""
    strategies = scheduler.get("strategies") or []
    if isinstance(strategies, list):
        scheduler["strategies"] = {
            entry["name"]: {k: v for k, v in entry.items() if k != "name"}
            for entry in strategies
            if isinstance(entry, dict) and "name" in entry
        }
    return scheduler


def strategies_as_list(document: Document) -> Document:
    """Undo :func:`_strategies_by_name`: ``scheduler.strategies`` back to a list."""
    scheduler = document.get("scheduler")
    if isinstance(scheduler, dict) and isinstance(scheduler.get("strategies"), dict):
        scheduler["strategies"] = [
            {"name": name, **(entry or {})} for name, entry in scheduler["strategies"].items()
        ]
    return document


def flatten(document: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Every leaf of ``document`` by dotted key; lists are leaves, strategies go by name."""
    leaves: dict[str, Any] = {}
    for key, value in document.items():
        dotted = f"{prefix}{key}"
        if dotted == "scheduler.strategies" and isinstance(value, list):
            value = {e.get("name", str(i)): e for i, e in enumerate(value) if isinstance(e, dict)}
            if not value:
                continue  # no strategies: nothing to compare, key by key
        if isinstance(value, Mapping) and value:
            leaves.update(flatten(value, dotted + "."))
        else:
            leaves[dotted] = value
    return leaves


def diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """The leaves that differ between two documents, sorted by key."""
    before, after = flatten(old), flatten(new)
    keys: Iterable[str] = sorted(set(before) | set(after))
    return [
        Change(key, before.get(key), after.get(key))
        for key in keys
        if before.get(key) != after.get(key) and not key.endswith(".name")
    ]
