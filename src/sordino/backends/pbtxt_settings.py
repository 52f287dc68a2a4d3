"""What sordino's ``ModelConfig`` takes from a Triton configuration in its JSON form
(:mod:`sordino.backends.pbtxt` reads ``config.pbtxt`` into it): the backend, the batchers,
the versions, warm-up, the instance groups — and, by name, what it does not do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sordino.errors import ConfigError

__all__ = ["sordino_settings"]

_KINDS = {"KIND_CPU": "cpu", "KIND_GPU": "gpu", "KIND_AUTO": "auto", "KIND_MODEL": "auto"}


def sordino_settings(config: Mapping[str, Any], *, source: str) -> dict[str, Any]:
    """What sordino's ``ModelConfig`` takes from a Triton configuration (JSON form).

    The backend (``backend``, or ``platform``), ``max_batch_size``, the version policy,
    the dynamic batcher (:func:`_dynamic_batching`; without one, and without a sequence
    batcher, requests are not joined: ``enabled: false``), the sequence batcher
    (:func:`_sequence_batching`), ``model_warmup`` and the instance group's count, kind
    and GPUs. What
    sordino does not do is refused by name when set to other than Triton's default
    (:data:`_REFUSED`, and an instance group's :data:`_GROUP_REFUSED`), rather than served
    as if absent. The rest stays for the backend to read (a Python model gets all of it).
    """
    settings: dict[str, Any] = {}
    backend = config.get("backend") or config.get("platform")
    if backend:
        settings["backend"] = str(backend)
    if "max_batch_size" in config:
        settings["max_batch_size"] = config["max_batch_size"]
    if config.get("default_model_filename"):
        settings["default_model_filename"] = str(config["default_model_filename"])
    refused = [key for key, what in _REFUSED.items() if _asks(_field(config, what))]
    policy = config.get("version_policy")
    if isinstance(policy, Mapping) and policy:
        settings["version_policy"] = {kind: dict(given or {}) for kind, given in policy.items()}
    batching = config.get("dynamic_batching")
    if isinstance(batching, Mapping):
        settings["dynamic_batching"] = _dynamic_batching(batching)
    sequences = config.get("sequence_batching")
    if isinstance(sequences, Mapping):
        settings["sequence_batching"] = _sequence_batching(sequences, source)
        if batching is None:  # (Triton takes one of the two)
            settings["dynamic_batching"] = _strategy_batching(sequences)
    elif batching is None:
        # Triton joins requests only under a dynamic (or sequence) batcher: without one
        # each request is its own batch (the backend's auto_complete_config may still
        # add the batcher: the loader reads that from the model's metadata).
        settings["dynamic_batching"] = {"enabled": False}
    agents = config.get("model_repository_agents")
    if _asks(agents):
        settings["checksums"] = _checksums(agents, source)
    if _asks(_field(config, ("response_cache", "enable"))):
        settings["response_cache"] = True
    warmup = config.get("model_warmup")
    if warmup:
        settings["model_warmup"] = [warmup] if isinstance(warmup, Mapping) else list(warmup)
    groups = config.get("instance_group")
    if groups:
        settings.update(_instance_groups(groups, source))
        for group in groups:
            refused += [f"instance_group.{key}" for key in _GROUP_REFUSED if _asks(group.get(key))]
        refused = sorted(set(refused))
    if refused:
        raise ConfigError(
            f"{source}: sordino does not support {', '.join(sorted(refused))}; remove "
            f"{'it' if len(refused) == 1 else 'them'} (docs/backends.md, config.pbtxt, says "
            "what sordino takes)"
        )
    return settings


_REFUSED = {
    # Ragged batching's extra tensors, made by Triton's core for the model.
    "batch_input": ("batch_input",),
    "batch_output": ("batch_output",),
}
"""Triton fields sordino does not do (its name → where it is): refused when set."""
_GROUP_REFUSED = ("host_policy", "secondary_devices", "passive", "profile")
"""An instance group's fields sordino does not do. (``rate_limiter`` is read as Triton
reads it without ``--rate-limit``, its default: not at all; sordino has no such mode.)"""
_QUEUE_KEYS = (
    "timeout_action",
    "default_timeout_microseconds",
    "allow_timeout_override",
    "max_queue_size",
)


def _instance_groups(groups: list[Any], source: str) -> dict[str, Any]:
    """The instances of Triton's ``instance_group`` entries as sordino's one group: the
    counts of several groups of the CPU added up; several GPU groups of one count on
    GPUs of their own joined; ConfigError for groups one kind of device and one count
    a device cannot say (of several kinds, or other counts on other GPUs)."""
    kinds = {_KINDS.get(str(g.get("kind", "KIND_AUTO")), "auto") for g in groups}
    if len(kinds) != 1:
        raise ConfigError(
            f"{source}: instance groups of several kinds ({', '.join(sorted(kinds))}) are not "
            "supported: sordino runs a model's instances on one kind of device"
        )
    (kind,) = kinds
    counts = [int(g.get("count", 1)) for g in groups]
    settings: dict[str, Any] = {"instance_kind": kind}
    gpus = [list(g.get("gpus") or ()) for g in groups]
    if len(groups) == 1:
        settings["instance_count"] = counts[0]
        if gpus[0]:
            settings["gpus"] = tuple(gpus[0])
        return settings
    if kind != "gpu" or not any(gpus):
        if kind == "gpu":
            raise ConfigError(
                f"{source}: several KIND_GPU groups without gpus are not supported; name "
                "each group's gpus"
            )
        settings["instance_count"] = sum(counts)
        return settings
    joined = [gpu for ids in gpus for gpu in ids]
    if not all(gpus) or len(set(counts)) != 1 or len(set(joined)) != len(joined):
        raise ConfigError(
            f"{source}: KIND_GPU groups are supported with the same count on GPUs of their "
            f"own (got counts {counts} on gpus {gpus}): sordino runs one count on each GPU"
        )
    settings["instance_count"] = counts[0]
    settings["gpus"] = tuple(joined)
    return settings


def _field(config: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    value: Any = config
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _dynamic_batching(section: Mapping[str, Any]) -> dict[str, Any]:
    """sordino's ``dynamic_batching`` from Triton's (what it does not take is refused by
    :func:`sordino_settings`).

    ``max_queue_delay_microseconds`` unset is Triton's 0 (sordino's own default, the
    scheduler's ``timeout_ms``, is for its own configuration). Other fields at their
    protobuf default (0, false, absent) are as if unset, as Triton reads them:
    ``priority_levels: 0`` is no priorities (sordino's default levels then, which a
    request that names none does not see), ``max_queue_size: 0`` Triton's unbounded
    queue (sordino's bounded default: it runs no unbounded queue). A level of
    ``priority_queue_policy`` takes its own policy, whole. Given a
    ``default_queue_policy``, ``allow_timeout_override`` is Triton's default (false)
    unless set.
    """
    folded: dict[str, Any] = {}
    if "preferred_batch_size" in section:
        folded["preferred_batch_size"] = list(section["preferred_batch_size"])
    # Unset, Triton's delay is 0: a batch of what is queued, no wait to fill it.
    folded["max_queue_delay_microseconds"] = section.get("max_queue_delay_microseconds", 0)
    for key in ("priority_levels", "default_priority_level", "preserve_ordering"):
        if _asks(section.get(key)):
            folded[key] = section[key]
    queue = section.get("default_queue_policy")
    if isinstance(queue, Mapping):
        folded["default_queue_policy"] = _queue_policy(queue)
    levels = section.get("priority_queue_policy")
    if isinstance(levels, Mapping) and levels:
        # A level's policy is whole on its own, Triton's defaults where it says nothing
        # (not the default policy's); its max_queue_size 0 is "no limit of its own".
        folded["priority_queue_policy"] = {
            int(level): _queue_policy(policy if isinstance(policy, Mapping) else {})
            for level, policy in levels.items()
        }
    return folded


def _queue_policy(queue: Mapping[str, Any]) -> dict[str, Any]:
    """sordino's queue policy from Triton's (``allow_timeout_override`` Triton's false
    unless set)."""
    policy = {key: queue[key] for key in _QUEUE_KEYS if _asks(queue.get(key))}
    policy.setdefault("allow_timeout_override", False)
    return policy


_STRATEGY_KEYS = {
    "direct": frozenset({"max_queue_delay_microseconds", "minimum_slot_utilization"}),
    "oldest": frozenset({"max_candidate_sequences"}),
}
"""What sordino's sequence batcher takes of each strategy of Triton's (direct's wait is
worked out from its pair by ``scheduling/settings.py``)."""
_STRATEGY_BATCHING = {
    "direct": frozenset(),
    "oldest": frozenset({"max_queue_delay_microseconds", "preferred_batch_size"}),
}
"""What of each strategy is the batcher's that joins the sequences' requests (sordino's
``dynamic_batching`` for the model: :func:`_strategy_batching`)."""
_STATE_KEYS = frozenset({"input_name", "output_name"})
_STATE_DESCRIPTIONS = frozenset({"data_type", "dims"})
_INITIAL = frozenset({"zero_data", "data_file", "data_type", "dims", "name"})
"""An ``initial_state`` sordino takes: zeros, or a file of the model's ``initial_state/``."""
"""A state's datatype and shape: those of its output, which the model declares already."""


def _initial(initial: Any, state: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    """What sordino takes of a ``state``'s ``initial_state``: its name, and the file for
    ``data_file`` (none for zeros: what it starts every state from anyway); None when it
    says more (refused by name). ConfigError when its type or shape is not the state's,
    which Triton refuses too."""
    entries = initial if isinstance(initial, list) else [initial] if initial else []
    if len(entries) != 1 or not isinstance(entries[0], Mapping) or set(entries[0]) - _INITIAL:
        return None
    (entry,) = entries
    if not entry.get("name"):  # as Triton refuses it
        raise ConfigError(
            f"{where}: state {state.get('input_name')!r}: initial_state needs its name; "
            'give one (name: "...")'
        )
    for key in ("data_type", "dims"):
        if key in entry and key in state and entry[key] != state[key]:
            raise ConfigError(
                f"{where}: state {state.get('input_name')!r}: initial_state {key} "
                f"{entry[key]} is not the state's ({state[key]}); give the same"
            )
    named = {"initial_name": str(entry["name"])}
    if entry.get("zero_data") is True and "data_file" not in entry:
        return named
    if entry.get("data_file") and entry.get("zero_data") is not True:
        return {**named, "initial_data_file": str(entry["data_file"])}
    return None


def _strategy_batching(section: Mapping[str, Any]) -> dict[str, Any]:
    """The batcher that joins the requests of a sequence model's sequences, from its
    strategy: ``oldest``'s ``max_queue_delay_microseconds`` (unset, Triton's 0: no wait)
    and ``preferred_batch_size``; no wait for ``direct``."""
    strategy = section.get("oldest")
    if isinstance(strategy, Mapping):
        folded: dict[str, Any] = {
            "max_queue_delay_microseconds": strategy.get("max_queue_delay_microseconds", 0)
        }
        if strategy.get("preferred_batch_size"):
            folded["preferred_batch_size"] = list(strategy["preferred_batch_size"])
        return folded
    # Direct (Triton's default strategy): what is ready runs, unless its slot utilization
    # says to wait (sequence_batching.direct, read by scheduling/settings.py).
    return {"max_queue_delay_microseconds": 0}


def _asks(value: Any) -> bool:
    """Whether a field is set to other than its protobuf default (which asks for nothing)."""
    return value not in (None, 0, 0.0, False, "", [], {})


def _checksums(agents: Any, source: str) -> dict[str, str]:
    """The file checksums of ``model_repository_agents``' ``checksum`` agents (Triton's
    one repository agent that needs no service of its own: it checks the model's files
    before each load, ``config/checksums.py``); ConfigError naming any other agent."""
    checksums: dict[str, str] = {}
    listed = agents.get("agents", []) if isinstance(agents, Mapping) else []
    for agent in listed:
        name = agent.get("name", "") if isinstance(agent, Mapping) else ""
        if name != "checksum":
            raise ConfigError(
                f"{source}: model_repository_agents: sordino does not support the repository "
                f"agent {name!r}; it runs Triton's 'checksum' agent only (remove the other, "
                "or give the model its files as the agent would)"
            )
        parameters = agent.get("parameters") or {}
        checksums.update({str(k): str(v) for k, v in dict(parameters).items()})
    return checksums


def _sequence_batching(section: Mapping[str, Any], source: str) -> dict[str, Any]:
    """sordino's ``sequence_batching`` from Triton's (``config/sequences.py``).

    Taken: ``max_sequence_idle_microseconds``, the ``direct`` or ``oldest`` strategy
    (``oldest.max_candidate_sequences``; its queue delay and preferred sizes are the
    batcher's, :func:`_strategy_batching`), ``control_input`` and each ``state``'s
    ``input_name``/``output_name`` and ``initial_state`` (:func:`_initial`), and
    ``iterative_sequence`` (a Python model's request rescheduling). Fields sordino does
    not implement are refused by name when set to other than Triton's default (ordering
    or slot utilization, a state's buffer options), rather than served as if absent.
    """
    where = f"{source}: sequence_batching"
    refused: list[str] = []
    settings: dict[str, Any] = {}
    for key, value in section.items():
        if key == "max_sequence_idle_microseconds":
            settings[key] = value
        elif key in _STRATEGY_KEYS:
            given = value if isinstance(value, Mapping) else {}
            settings[key] = {k: v for k, v in given.items() if k in _STRATEGY_KEYS[key]}
            taken = _STRATEGY_KEYS[key] | _STRATEGY_BATCHING[key]
            refused += [f"{key}.{k}" for k, v in given.items() if k not in taken and _asks(v)]
        elif key == "control_input":
            settings[key] = list(value)
        elif key == "iterative_sequence":
            settings[key] = value is True or str(value).lower() == "true"
        elif key == "state":
            states = []
            for state in value:
                given = state if isinstance(state, Mapping) else {}
                own = {k: v for k, v in given.items() if k in _STATE_KEYS}
                kept = _STATE_KEYS | _STATE_DESCRIPTIONS
                initial = _initial(given.get("initial_state"), given, where)
                if initial is not None:
                    own.update(initial)
                    kept = kept | {"initial_state"}
                states.append(own)
                refused += [f"state.{k}" for k, v in given.items() if k not in kept and _asks(v)]
            settings[key] = states
        elif _asks(value):
            refused.append(key)
    if refused:
        raise ConfigError(
            f"{where}: sordino does not support {', '.join(sorted(set(refused)))}; remove "
            "them (docs/configuration.md#sequence_batching says what it takes)"
        )
    return settings
