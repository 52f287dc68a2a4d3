"""Runtime hints embedded in an ONNX file's ``metadata_props`` (ATC's ``--embed-runtime-hints``).

Keys are namespaced ``sordino.hints.<key>``, with ``sordino.hints.schema_version``
saying how to read them (this build reads version 1). ``sordino hints embed`` writes
them; loading a model reads them and fills in what its configuration does not set
itself — explicit configuration wins, and the log names every hint applied and every
hint overridden. A hint that is not understood (an unknown key, a newer schema, a
value out of range) stops the load with the reason: never silently ignored.

========================  =====================================================
key                       meaning
========================  =====================================================
``max_batch_size``        the model's ``max_batch_size``
``scheduler_mode``        the model's ``scheduler_mode``
``memory_pool``           the arena size it wants (``memory.pool_size``, e.g. 2GB)
``precision``             ``fp32``, ``fp16``, ``int8`` or ``int4`` (what the weights are)
``float_reference``       for a quantized model: the float model it came from
``accuracy_bound``        for a quantized model: the least top-1 agreement kept
``guard_sample``          for a quantized model: held-out inputs (base64 .npz)
``iterative``             serve the model as a generator: its ``iterative:`` entry
                          (a JSON object; ``{}`` takes every default)
``step_cache``            step caching of a generator: the threshold of
                          ``iterative.step_cache`` (0 to 1; 0 never skips a step)
``memory_strategy``       the arena's placement strategy (``memory.strategy``)
========================  =====================================================

``sordino hints embed MODEL -o OUT`` with no hint named embeds what sordino picks for
the file itself (``--auto``): ``fragmentation_aware`` placement, and for a denoiser
(inputs ``sample``, ``timestep``, ``condition``; output ``noise``) generator serving
with step caching on.

A hint is data from the model file, so it is held to what the file may ask for:
``float_reference`` is a relative path inside the quantized file's own folder (never
absolute, never ``..``: a model loads no file outside its folder or repository), and
``guard_sample`` is at most :data:`MAX_GUARD_SAMPLE_CHARS` characters, its arrays
checked against :data:`~sordino.operations.quantize.MAX_SAMPLE_ROWS` and
:data:`~sordino.operations.quantize.MAX_SAMPLE_ELEMENTS` before any is built;
``iterative`` is at most :data:`MAX_ITERATIVE_CHARS` characters of JSON and its sample
at most :data:`MAX_HINTED_SAMPLE_ELEMENTS` values (every request allocates one).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Literal

from pydantic import Field, ValidationError, field_validator

from sordino.config import ModelConfig, RuntimeConfig, SchedulerMode, Size
from sordino.config.base import MAX_BATCH_SIZE, MAX_POOL_SIZE, MIN_POOL_SIZE, Section
from sordino.config.iterative import IterativeConfig, StepCacheConfig
from sordino.config.loader import shown_value
from sordino.config.memory import MemoryStrategy
from sordino.errors import ModelLoadError
from sordino.models.onnx_props import read_props, write_props

__all__ = [
    "MAX_GUARD_SAMPLE_CHARS",
    "MAX_HINTED_SAMPLE_ELEMENTS",
    "MAX_ITERATIVE_CHARS",
    "NAMESPACE",
    "SCHEMA_VERSION",
    "AppliedHints",
    "ModelHints",
    "apply_hints",
    "embed_hints",
    "log_applied",
    "read_hints",
    "with_runtime_hints",
]

log = logging.getLogger("sordino.hints")

NAMESPACE = "sordino.hints."
SCHEMA_VERSION = 1
MAX_GUARD_SAMPLE_CHARS = 4 * 1024 * 1024
"""The longest ``guard_sample`` hint (base64 of a compressed .npz; 64 rows need far less)."""
MAX_ITERATIVE_CHARS = 16 * 1024
"""The longest ``iterative`` hint (JSON of an ``iterative:`` entry)."""
MAX_HINTED_SAMPLE_ELEMENTS = 1 << 24
"""The most values in one sample an ``iterative`` hint may ask for (64 MiB of float32)."""

# Which ModelConfig field each per-model hint fills in.
_MODEL_FIELDS = {"max_batch_size": "max_batch_size", "scheduler_mode": "scheduler_mode"}


class ModelHints(Section):
    """The hints one model file carries (every key optional)."""

    max_batch_size: int | None = Field(default=None, ge=0, le=MAX_BATCH_SIZE)
    scheduler_mode: SchedulerMode | None = None
    memory_pool: Size | None = Field(default=None, ge=MIN_POOL_SIZE, le=MAX_POOL_SIZE)
    precision: Literal["fp32", "fp16", "int8", "int4"] | None = None
    float_reference: str | None = Field(default=None, min_length=1, max_length=1024)
    """The float model, relative to the quantized file's folder and inside it."""
    accuracy_bound: float | None = Field(default=None, gt=0, le=1)
    guard_sample: str | None = Field(default=None, max_length=MAX_GUARD_SAMPLE_CHARS)
    """A held-out input sample (base64 of an .npz) for the accuracy guard."""
    iterative: IterativeConfig | None = None
    """Serve the model as a generator with this ``iterative:`` entry (JSON in the file)."""
    step_cache: float | None = Field(default=None, ge=0.0, le=1.0)
    """Turn on ``iterative.step_cache`` with this threshold."""
    memory_strategy: MemoryStrategy | None = None
    """The arena's placement strategy (``memory.strategy``)."""

    @field_validator("iterative", mode="before")
    @classmethod
    def _iterative_json(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        if len(value) > MAX_ITERATIVE_CHARS:
            raise ValueError(f"is longer than {MAX_ITERATIVE_CHARS} characters")
        try:
            parsed = json.loads(value)
        except ValueError:
            raise ValueError(
                'must be a JSON object of iterative: keys, e.g. {"guidance": 3.0}'
            ) from None
        if not isinstance(parsed, dict):
            raise ValueError('must be a JSON object of iterative: keys, e.g. {"guidance": 3.0}')
        return parsed

    @field_validator("iterative")
    @classmethod
    def _sample_bounded(cls, value: IterativeConfig | None) -> IterativeConfig | None:
        if value is not None and math.prod(value.sample_shape) > MAX_HINTED_SAMPLE_ELEMENTS:
            raise ValueError(
                f"sample_shape {list(value.sample_shape)} holds more than "
                f"{MAX_HINTED_SAMPLE_ELEMENTS} values"
            )
        return value

    @field_validator("float_reference")
    @classmethod
    def _inside_the_model_folder(cls, value: str | None) -> str | None:
        if value is None:
            return None
        if PurePosixPath(value).is_absolute() or PureWindowsPath(value).is_absolute():
            raise ValueError(
                "must be a path relative to the quantized model's folder (e.g. "
                "'model.onnx'), not an absolute path"
            )
        if ".." in PurePosixPath(value.replace("\\", "/")).parts:
            raise ValueError("must stay inside the quantized model's folder: no '..' parts")
        return value

    def as_props(self) -> dict[str, str]:
        """The ``metadata_props`` entries, schema version included."""
        props = {f"{NAMESPACE}schema_version": str(SCHEMA_VERSION)}
        for key, value in self.model_dump(exclude_none=True, exclude={"iterative"}).items():
            props[NAMESPACE + key] = str(value)
        if self.iterative is not None:
            # Only the keys given: the rest stay defaults, and "explicit" keeps its meaning.
            entry = self.iterative.model_dump(mode="json", exclude_unset=True)
            props[NAMESPACE + "iterative"] = json.dumps(entry, separators=(",", ":"))
        return props


@dataclass(frozen=True, slots=True)
class AppliedHints:
    """What loading did with a file's hints: applied, and kept from explicit config."""

    config: ModelConfig
    hints: ModelHints
    applied: tuple[str, ...]
    overridden: tuple[str, ...]


def _props(path: Path) -> dict[str, str]:
    return read_props(path)


def read_hints(path: Path) -> ModelHints | None:
    """The hints in ``path``; None when it has none. Raises ModelLoadError for bad ones."""
    props = {k[len(NAMESPACE) :]: v for k, v in _props(path).items() if k.startswith(NAMESPACE)}
    if not props:
        return None
    version = props.pop("schema_version", None)
    if version != str(SCHEMA_VERSION):
        raise ModelLoadError(
            f"{path}: runtime hints of schema version {version!r}; this sordino reads version "
            f"{SCHEMA_VERSION}: re-embed them with this sordino (sordino hints embed)"
        )
    unknown = sorted(set(props) - set(ModelHints.model_fields))
    if unknown:
        raise ModelLoadError(
            f"{path}: unknown runtime hint(s) {', '.join(NAMESPACE + k for k in unknown)}; "
            f"known: {', '.join(ModelHints.model_fields)}"
        )
    try:
        return ModelHints.model_validate(props)
    except ValidationError as exc:
        error = exc.errors()[0]
        key = NAMESPACE + ".".join(str(part) for part in error["loc"])
        value = shown_value(props.get(str(error["loc"][0])))
        message = str(error["msg"]).removeprefix("Value error, ")
        raise ModelLoadError(f"{path}: runtime hint {key}={value} is refused: {message}") from None


def embed_hints(source: Path, target: Path, hints: ModelHints) -> dict[str, str]:
    """Write ``source`` to ``target`` with ``hints`` (replacing any earlier sordino hints)."""
    props = hints.as_props()
    write_props(source, target, props, replace=NAMESPACE)
    return props


def apply_hints(config: ModelConfig, path: Path) -> AppliedHints | None:
    """``config`` with the hints of ``path`` filling what it does not set explicitly."""
    hints = read_hints(path)
    if hints is None:
        return None
    explicit = config.model_fields_set
    update: dict[str, object] = {}
    applied: list[str] = []
    overridden: list[str] = []
    for hint, field in _MODEL_FIELDS.items():
        value = getattr(hints, hint)
        if value is None:
            continue
        if field in explicit:
            overridden.append(f"{hint}={value} (config says {getattr(config, field)})")
        else:
            update[field] = value
            applied.append(f"{hint}={value}")
    iterative = config.iterative
    if hints.iterative is not None:
        if iterative is not None or config.streaming is not None:
            says = "iterative" if iterative is not None else "streaming"
            overridden.append(f"iterative (config makes the model {says})")
        else:
            iterative = hints.iterative
            update["iterative"] = iterative
            applied.append("iterative")
    if hints.step_cache is not None:
        shown = f"step_cache={hints.step_cache:g}"
        if iterative is None:
            overridden.append(f"{shown} (the model is not served as a generator: no iterative)")
        elif "step_cache" in iterative.model_fields_set:
            overridden.append(f"{shown} (config says iterative.step_cache)")
        else:
            cache = StepCacheConfig(enabled=True, threshold=hints.step_cache)
            update["iterative"] = iterative.model_copy(update={"step_cache": cache})
            applied.append(shown)
    for hint in ("precision", "float_reference", "accuracy_bound"):  # read by the guard
        value = getattr(hints, hint)
        if value is not None:
            applied.append(f"{hint}={value}")
    new = config.model_copy(update=update) if update else config
    if update:  # validate the combination as a configuration would be
        try:
            new = ModelConfig.model_validate(new.model_dump())
        except ValidationError as exc:
            raise ModelLoadError(f"{path}: runtime hints do not fit the model: {exc}") from None
    return AppliedHints(new, hints, tuple(applied), tuple(overridden))


def log_applied(name: str, result: AppliedHints) -> None:
    """Say which hints a model took and which its explicit configuration overrode."""
    if result.applied:
        log.info("model %s: runtime hints applied: %s", name, ", ".join(result.applied))
    if result.overridden:
        log.info(
            "model %s: runtime hints overridden by explicit config: %s",
            name,
            ", ".join(result.overridden),
        )


def with_runtime_hints(config: RuntimeConfig, paths: Sequence[Path]) -> RuntimeConfig:
    """``config`` with the runtime-wide hints of the model files ``paths`` applied.

    ``memory_pool``: the largest one becomes ``memory.pool_size``; ``memory_strategy``:
    the first file's (in load order) becomes ``memory.strategy``. Explicit configuration
    (file or command line) wins, and so does a memory manager turned off; the log says
    which hints were applied and which were not, and why.
    """
    found = [
        (path, hints)
        for path in paths
        if path.suffix == ".onnx" and (hints := read_hints(path)) is not None
    ]
    config = _with_pool_hint(config, [(h.memory_pool, p) for p, h in found if h.memory_pool])
    strategies = [(hints.memory_strategy, path) for path, hints in found if hints.memory_strategy]
    if not strategies:
        return config
    strategy, path = strategies[0]
    for other, other_path in strategies[1:]:
        if other != strategy:
            log.info(
                "runtime hint memory_strategy=%s (%s) not applied: %s asks for %s first",
                other,
                other_path.name,
                path.name,
                strategy,
            )
    memory = config.memory
    if "strategy" in memory.model_fields_set:
        log.info(
            "runtime hint memory_strategy=%s (%s) overridden by memory.strategy=%s",
            strategy,
            path.name,
            memory.strategy,
        )
        return config
    if not memory.enabled:
        log.info(
            "runtime hint memory_strategy=%s (%s) not applied: the memory manager is off "
            "(memory.enabled: false); the arena stays best_fit",
            strategy,
            path.name,
        )
        return config
    log.info("runtime hint memory_strategy=%s (%s) applied: memory.strategy", strategy, path.name)
    memory = memory.model_copy(update={"strategy": strategy})
    return config.model_copy(update={"memory": memory})


def _with_pool_hint(config: RuntimeConfig, wanted: Sequence[tuple[int, Path]]) -> RuntimeConfig:
    if not wanted:
        return config
    size, path = max(wanted)
    if "pool_size" in config.memory.model_fields_set:
        log.info(
            "runtime hint memory_pool=%d bytes (%s) overridden by memory.pool_size=%s",
            size,
            path.name,
            config.memory.pool_size,
        )
        return config
    log.info("runtime hint memory_pool=%d bytes (%s) applied: memory.pool_size", size, path.name)
    memory = config.memory.model_copy(update={"pool_size": size})
    return config.model_copy(update={"memory": memory})
