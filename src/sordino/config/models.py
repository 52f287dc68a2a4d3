"""The ``models`` entries: one model's configuration, in Triton's vocabulary.

The per-model section speaks Triton's vocabulary (``max_batch_size``,
``dynamic_batching``, ``instance_group``, ``version_policy``) so that a Triton
``config.pbtxt`` translates key for key. ``docs/configuration.md`` is the reference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from sordino.config.base import MAX_BATCH_SIZE, ExpandedPath, HashedDict, Section
from sordino.config.checksums import check_checksums
from sordino.config.declared import DeclaredTensor, check_reshape
from sordino.config.devices import ProviderName
from sordino.config.executor import RayModelOptions
from sordino.config.iterative import IterativeConfig
from sordino.config.memory import FrameworkMemoryConfig
from sordino.config.onnxruntime import OnnxRuntimeOptions
from sordino.config.scheduler import SchedulerMode
from sordino.config.sequences import SequenceBatchingConfig
from sordino.config.warmup import WarmupSample

__all__ = [
    "MODEL_NAME_PATTERN",
    "AllVersions",
    "DynamicBatchingConfig",
    "LatestVersions",
    "LevelQueuePolicy",
    "ModelConfig",
    "QueuePolicy",
    "SpecificVersions",
    "StreamingConfig",
    "VersionPolicy",
]

MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
"""What a model name may be: letters, digits, ``_``, ``.`` and ``-``, not starting with
``.``, ``_`` or ``-``. A name is also a folder of the model repository, so it never holds a
path separator and is never ``.`` or ``..``."""


MAX_QUEUE_SIZE = 1_000_000
"""The longest queue a model may have."""
_HOUR_US = 3_600_000_000
_MINUTE_US = 60_000_000


class QueuePolicy(Section):
    """Triton's ``default_queue_policy``: deadlines and the size limit of a model's queue."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    """At the deadline: REJECT fails the request; DELAY keeps it but behind on-time ones."""
    default_timeout_microseconds: int = Field(default=0, ge=0, le=_HOUR_US)
    """Queue deadline per request; 0 means no deadline."""
    allow_timeout_override: bool = True
    """Whether a request may set its own (shorter or longer) queue deadline."""
    max_queue_size: int = Field(default=1024, le=MAX_QUEUE_SIZE)
    """Most requests waiting; more are refused with 503 (QueueFull)."""

    @field_validator("max_queue_size")
    @classmethod
    def _bounded(cls, size: int) -> int:
        if size == 0:
            raise ValueError(
                "max_queue_size 0 means an unbounded queue in Triton; sordino never runs an "
                "unbounded queue, set a positive limit"
            )
        if size < 0:
            raise ValueError("max_queue_size must be a positive limit")
        return size


class LevelQueuePolicy(Section):
    """One priority level's own queue policy (Triton's ``priority_queue_policy``): its
    requests' deadlines, what happens at one, and how many of them may wait."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    """At the deadline: REJECT fails the request; DELAY keeps it but behind on-time ones."""
    default_timeout_microseconds: int = Field(default=0, ge=0, le=_HOUR_US)
    """Queue deadline of a request at this level; 0 means no deadline."""
    allow_timeout_override: bool = True
    """Whether a request at this level may set its own queue deadline."""
    max_queue_size: int = Field(default=0, ge=0, le=MAX_QUEUE_SIZE)
    """Most requests of this level waiting (more are refused with 503, QueueFull); 0: no
    limit of the level's own (the model's ``default_queue_policy.max_queue_size`` bounds
    every level together)."""


class DynamicBatchingConfig(Section):
    """Triton's ``dynamic_batching`` section; None inherits the scheduler's strategy."""

    enabled: bool | None = None
    """False: requests are never joined into one batch (each runs alone, its own rows at
    most ``max_batch_size``), as Triton runs a model whose ``config.pbtxt`` has no
    ``dynamic_batching``; None inherits the strategy's ``enabled``."""

    preferred_batch_size: tuple[Annotated[int, Field(ge=1, le=MAX_BATCH_SIZE)], ...] = Field(
        default=(), max_length=64
    )
    """Batch sizes to form when possible; empty inherits ``preferred_batch``."""
    max_queue_delay_microseconds: int | None = Field(default=None, ge=0, le=_MINUTE_US)
    """Longest wait for a batch to fill (at most a minute); None inherits ``timeout_ms``."""
    min_batch_size: int | None = Field(default=None, ge=1, le=MAX_BATCH_SIZE)
    """Smallest batch worth running early (sordino extension); None inherits ``min_batch``."""
    max_batch: int | None = Field(default=None, ge=1, le=MAX_BATCH_SIZE)
    """Largest batch formed for this model (sordino extension); None inherits the
    strategy's ``max_batch``. Unlike ``max_batch_size`` it leaves the rows a request may
    carry alone, so it can be lowered live without refusing larger requests."""
    priority_levels: int = Field(default=3, ge=1, le=100)
    """Number of priority levels; level 1 is served first."""
    default_priority_level: int = 2
    """Level of requests that ask for none; when omitted, the middle level."""
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: Annotated[
        dict[Annotated[int, Field(ge=1)], LevelQueuePolicy], AfterValidator(HashedDict)
    ] = Field(default_factory=HashedDict)
    """A priority level's own queue policy, by level (Triton's ``priority_queue_policy``);
    levels not named follow ``default_queue_policy``."""
    preserve_ordering: bool = False
    """Answer requests in the order their batches started (Triton's ``preserve_ordering``):
    a batch that ends before one started earlier (on another instance) waits for it."""

    @model_validator(mode="after")
    def _policies_of_levels(self) -> DynamicBatchingConfig:
        outside = sorted(level for level in self.priority_queue_policy
                         if level > self.priority_levels)  # fmt: skip
        if outside:
            raise ValueError(
                f"priority_queue_policy names level(s) {outside}, outside priority_levels "
                f"1..{self.priority_levels}"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _default_level_is_middle(cls, data: object) -> object:
        if isinstance(data, Mapping) and "default_priority_level" not in data:
            levels = data.get("priority_levels")
            if isinstance(levels, int) and not isinstance(levels, bool) and levels >= 1:
                return {**data, "default_priority_level": (levels + 1) // 2}
        return data

    @field_validator("default_priority_level")
    @classmethod
    def _level_in_range(cls, level: int, info: ValidationInfo) -> int:
        levels = info.data.get("priority_levels")
        if levels is not None and not 1 <= level <= levels:
            raise ValueError(
                f"default_priority_level ({level}) must be between 1 and priority_levels ({levels})"
            )
        return level


class LatestVersions(Section):
    num_versions: int = Field(default=1, ge=1, le=1000)
    """How many of the highest-numbered versions to serve."""


class AllVersions(Section):
    pass


class SpecificVersions(Section):
    versions: tuple[Annotated[int, Field(ge=1)], ...] = Field(min_length=1)
    """The version numbers to serve."""


class VersionPolicy(Section):
    """Triton's ``version_policy``: exactly one of ``latest``, ``all``, ``specific``."""

    latest: LatestVersions | None = None
    all: AllVersions | None = None
    specific: SpecificVersions | None = None

    @model_validator(mode="before")
    @classmethod
    def _empty_means_present(cls, data: object) -> object:
        # YAML writes Triton's `all: {}` as `all:` (None), but a dumped policy writes the
        # kinds it is not as None too: None means "chosen" only when nothing else is set.
        if not isinstance(data, Mapping):
            return data
        chosen = {key: value for key, value in data.items() if value is not None}
        return chosen or {key: {} for key in data}

    @model_validator(mode="after")
    def _exactly_one(self) -> VersionPolicy:
        chosen = [kind for kind in ("latest", "all", "specific") if getattr(self, kind) is not None]
        if len(chosen) != 1:
            raise ValueError(f"give exactly one of latest, all, specific (got {chosen or 'none'})")
        return self

    @property
    def kind(self) -> Literal["latest", "all", "specific"]:
        """Which of the three policies this is."""
        if self.latest is not None:
            return "latest"
        return "all" if self.all is not None else "specific"

    def select(self, available: Iterable[int]) -> tuple[int, ...]:
        """Return the versions to serve out of ``available``, ascending."""
        present = sorted(set(available))
        if self.latest is not None:
            return tuple(present[-self.latest.num_versions :])
        if self.specific is not None:
            return tuple(v for v in present if v in self.specific.versions)
        return tuple(present)


class StreamingConfig(Section):
    """Serve the model as a step model that streams one response per step.

    Each step's outputs are sent to the client; the outputs named in ``carry`` become
    the inputs of the next step, and the stream ends once the BOOL output ``done`` is
    true for every row (or after ``max_steps`` steps, which is an error).
    """

    carry: dict[str, str] = Field(min_length=1)
    """Output name -> the input it feeds on the next step."""
    done: str = Field(min_length=1)
    """A BOOL output; true ends the stream of that row."""
    max_steps: int = Field(default=1000, ge=1, le=1_000_000)
    """Most steps one request may take; a model still not done then fails the request."""
    emit: str | None = None
    """A BOOL output: a step where it is false for every row sends no response. With it
    the model is decoupled in Triton's sense: zero, one or many responses per request."""
    state: tuple[str, ...] = ()
    """Carried inputs the client does not send: the first step gets zeros for them."""


# Flat Triton keys that belong under dynamic_batching; ModelConfig moves them there.
_BATCHING_KEYS = (
    "preferred_batch_size",
    "max_queue_delay_microseconds",
    "priority_levels",
    "default_priority_level",
    "default_queue_policy",
    "min_batch_size",
)


_KINDS = {"KIND_CPU": "cpu", "KIND_GPU": "gpu", "KIND_AUTO": "auto"}


def _triton_instance_group(groups: object) -> dict[str, object]:
    if not isinstance(groups, list | tuple) or len(groups) != 1 or not isinstance(groups[0], dict):
        raise ValueError("instance_group must be a list with exactly one {count, kind} entry")
    unknown = sorted(set(groups[0]) - {"count", "kind", "gpus"})
    if unknown:
        raise ValueError(
            f"instance_group keys {unknown} are not supported; use count, kind and gpus"
        )
    kind = groups[0].get("kind", "KIND_AUTO")
    short = _KINDS.get(kind.upper(), kind.lower()) if isinstance(kind, str) else kind
    if short not in ("cpu", "gpu", "auto"):
        raise ValueError(
            f"instance_group kind {kind!r} is not valid; use KIND_CPU, KIND_GPU or KIND_AUTO"
        )
    folded: dict[str, object] = {"instance_count": groups[0].get("count", 1)}
    folded["instance_kind"] = short
    if "gpus" in groups[0]:
        folded["gpus"] = groups[0]["gpus"]
    return folded


class ModelConfig(Section):
    """One model: an explicit ``models:`` entry, or a repository folder's ``config.yaml``.

    In a repository, ``name`` and ``path`` come from the folder and may be omitted.
    Triton spellings are accepted as aliases (see :attr:`triton_aliases`).
    """

    triton_aliases: ClassVar[tuple[str, ...]] = ("platform", "instance_group", *_BATCHING_KEYS)
    """Keys accepted in the file that are folded into the fields below."""

    name: str | None = Field(default=None, pattern=MODEL_NAME_PATTERN)
    """Model name used in URLs (/v2/models/<name>)."""
    path: ExpandedPath | None = None
    """An .onnx file, or a folder of numbered version folders (1/model.onnx, 2/...)."""
    default_model_filename: str | None = Field(default=None, pattern=r"^[^/\\]+$", max_length=255)
    """The file each version folder serves (Triton's ``default_model_filename``); None:
    ``model.onnx`` (``model.py``), or the one file of the backend's kind there."""
    backend: str = Field(default="onnxruntime", pattern=r"^[a-z][a-z0-9_]*$", max_length=64)
    """Runtime that executes the model: ``onnxruntime`` (Triton's ``platform:
    onnxruntime_onnx``), ``python`` (a Triton Python-backend ``model.py``), or a kind a
    package registers (docs/backends.md); an unknown kind is refused when the model loads."""
    max_batch_size: int | None = Field(default=None, ge=0, le=MAX_BATCH_SIZE)
    """Largest batch; None uses the scheduler's max_batch; 0 means never batch."""
    dynamic_batching: DynamicBatchingConfig = DynamicBatchingConfig()
    instance_count: int = Field(default=1, ge=1, le=256)
    """Model instances (sessions) run in parallel, on each device the model runs on."""
    instance_kind: Literal["cpu", "gpu", "auto"] = "auto"
    """Where instances run: cpu, gpu (CUDA devices ``gpus``), auto (``execution_providers``)."""
    gpus: tuple[Annotated[int, Field(ge=0)], ...] = ()
    """CUDA device ids for ``instance_kind: gpu``; empty means device 0."""
    isolation: Literal["process", "thread"] = "process"
    """process: each instance in its own worker process; thread: inside the server."""
    execution_providers: tuple[ProviderName, ...] = ("CPUExecutionProvider",)
    """ONNX Runtime providers in order of preference (aliases cpu, cuda, ... accepted)."""
    intra_op_threads: int | None = Field(default=None, ge=1, le=1024)
    """Threads ONNX Runtime uses inside one operator; None: the machine's cores divided
    among the model's instances (at least 1)."""
    onnxruntime: OnnxRuntimeOptions = OnnxRuntimeOptions()
    """ONNX Runtime's session options: inter-op threads, execution mode, graph
    optimization level, memory pattern (Triton's ONNX Runtime backend parameters)."""
    thread_spinning: bool = False
    """Let ONNX Runtime's intra- and inter-op threads spin (busy-wait) for work between
    operators: a little lower latency for some models, but each running instance burns
    its threads' cores even at low load. Off by default."""
    scheduler_mode: SchedulerMode | None = None
    """Overrides ``scheduler.mode`` for this model."""
    version_policy: VersionPolicy = VersionPolicy(latest=LatestVersions())
    """Which numbered versions to serve; the highest one by default."""
    streaming: StreamingConfig | None = None
    """Run the model step by step, streaming a response per step; None: one response."""
    iterative: IterativeConfig | None = None
    """Serve the model as a denoiser in a sampler loop the runtime owns (docs/generation.md)."""
    ray: RayModelOptions | None = None
    """How Ray schedules each instance's actor; only with ``executor.kind: ray``."""
    sequence_batching: SequenceBatchingConfig | None = None
    """Serve a stateful model with Triton's sequence batcher (docs/http-api.md#sequences)."""
    input: tuple[DeclaredTensor, ...] = ()
    """The inputs the model must have (Triton's ``input`` list): checked at load."""
    output: tuple[DeclaredTensor, ...] = ()
    """The outputs the model must have (Triton's ``output`` list): checked at load."""
    model_warmup: tuple[WarmupSample, ...] = ()
    """Samples run on each instance before the model serves (Triton's ``model_warmup``)."""
    response_cache: bool = False
    """Answer a request whose inputs equal those of a recent successful one from the
    server's response cache (Triton's ``response_cache { enable: true }``); takes effect
    where the server has one (``server.response_cache_size``)."""
    label_filename: ExpandedPath | dict[str, ExpandedPath] | None = None
    """Labels for Triton's classification extension: a text file with one label per line
    (line i names class i), for every output, or a mapping of output name to file.
    A relative path is taken from the .onnx file's folder, or in a repository from the
    model's folder (beside ``config.yaml``)."""
    framework_memory: FrameworkMemoryConfig = FrameworkMemoryConfig()
    """ONNX Runtime's CPU (and CUDA) arenas in the model's worker processes (docs/memory.md)."""
    checksums: Annotated[dict[str, str], AfterValidator(check_checksums)] = Field(
        default_factory=HashedDict
    )
    """Files checked before every load of the model, as Triton's checksum repository
    agent checks them: ``ALGORITHM:PATH`` (MD5; the path from the model's folder) →
    the file's digest in hex. A file that differs fails the load."""
    triton_config: dict[str, Any] | None = Field(default=None, exclude=True)
    """Set by model control, not written: the Triton configuration (JSON form) a load's
    ``config`` parameter gave, which the model's backend reads instead of the folder's
    ``config.pbtxt`` (a Python model's ``args["model_config"]`` start from it)."""

    @field_validator("framework_memory")
    @classmethod
    def _framework_memory_needs_a_process(
        cls, value: FrameworkMemoryConfig, info: ValidationInfo
    ) -> FrameworkMemoryConfig:
        if info.data.get("isolation") == "thread" and not value.is_default:
            raise ValueError(
                "framework_memory is not supported with isolation: thread (the model shares "
                "the server's ONNX Runtime); use isolation: process or remove framework_memory"
            )
        return value

    @field_validator("default_model_filename")
    @classmethod
    def _a_file_name(cls, value: str | None) -> str | None:
        if value in (".", ".."):
            raise ValueError(f"{value!r} is not a file name; name the model file itself")
        return value

    @model_validator(mode="before")
    @classmethod
    def _fold_triton_aliases(cls, data: object) -> object:
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        if "platform" in data:
            platform = data.pop("platform")
            if "backend" in data:
                raise ValueError("give backend or platform, not both")
            if platform != "onnxruntime_onnx":
                raise ValueError(f"platform {platform!r} is not supported; use onnxruntime_onnx")
            data["backend"] = "onnxruntime"
        if "instance_group" in data:
            if "instance_count" in data:
                raise ValueError("give instance_count or instance_group, not both")
            data.update(_triton_instance_group(data.pop("instance_group")))
        flat = {key: data.pop(key) for key in _BATCHING_KEYS if key in data}
        if flat or data.get("dynamic_batching", {}) is None:
            nested = data.get("dynamic_batching") or {}
            if not isinstance(nested, Mapping):
                return data  # let the type error for dynamic_batching speak
            both = sorted(set(flat) & set(nested))
            if both:
                raise ValueError(f"{both} given both on the model and under dynamic_batching")
            data["dynamic_batching"] = {**nested, **flat}
        return data

    @field_validator("execution_providers")
    @classmethod
    def _some_provider(cls, providers: tuple[str, ...]) -> tuple[str, ...]:
        if not providers:
            raise ValueError("execution_providers needs at least one provider, e.g. [cpu]")
        return providers

    @model_validator(mode="after")
    def _one_step_kind(self) -> ModelConfig:
        if self.streaming is not None and self.iterative is not None:
            raise ValueError("a model is either streaming or iterative, not both; remove one")
        if self.response_cache:
            kind = next(
                (k for k in ("streaming", "iterative", "sequence_batching") if getattr(self, k)),
                None,
            )
            if kind is not None:
                raise ValueError(
                    f"response_cache is not supported for a model with {kind} (its answers "
                    "depend on more than its inputs); remove response_cache"
                )
        sequences = self.sequence_batching
        iterating = sequences is not None and sequences.iterative_sequence
        if iterating and self.backend != "python":
            raise ValueError(
                "sequence_batching.iterative_sequence needs a model that runs its requests "
                "again itself (Triton's request rescheduling: backend python); the "
                f"{self.backend} backend never does, so remove iterative_sequence"
            )
        multi_step = next((k for k in ("streaming", "iterative") if getattr(self, k)), None)
        if multi_step is None and iterating:
            multi_step = "sequence_batching.iterative_sequence"
        if self.dynamic_batching.preserve_ordering and multi_step is not None:
            raise ValueError(
                f"dynamic_batching.preserve_ordering is not supported for a model with "
                f"{multi_step} (a request runs in several batches); remove it"
            )
        return self

    @model_validator(mode="after")
    def _onnxruntime_for_onnx_runtime(self) -> ModelConfig:
        if self.backend == "python" and not self.onnxruntime.is_default:
            raise ValueError(
                "onnxruntime sets ONNX Runtime's session options, which a Python model "
                "opens itself (if at all); remove onnxruntime"
            )
        return self

    @model_validator(mode="after")
    def _reshapes_hold_their_dims(self) -> ModelConfig:
        for kind in ("input", "output"):
            for tensor in getattr(self, kind):
                if tensor.reshape is not None:
                    check_reshape(
                        f"{kind} {tensor.name}",
                        tensor.dims,
                        tensor.reshape,
                        batching=self.max_batch_size != 0,
                    )
        return self

    @model_validator(mode="after")
    def _batching_fits_max_batch_size(self) -> ModelConfig:
        batching, limit = self.dynamic_batching, self.max_batch_size
        if limit == 0 and (
            batching.preferred_batch_size
            or batching.min_batch_size is not None
            or batching.max_batch is not None
        ):
            raise ValueError(
                "max_batch_size 0 means this model never batches, so preferred_batch_size, "
                "min_batch_size and max_batch cannot apply; remove them or raise max_batch_size"
            )
        cap = batching.max_batch
        if (
            cap is not None
            and batching.min_batch_size is not None
            and batching.min_batch_size > cap
        ):
            raise ValueError(
                f"dynamic_batching.min_batch_size ({batching.min_batch_size}) exceeds "
                f"dynamic_batching.max_batch ({cap})"
            )
        if limit:
            too_big = [size for size in batching.preferred_batch_size if size > limit]
            if too_big:
                raise ValueError(f"preferred_batch_size {too_big} exceeds max_batch_size {limit}")
            if batching.min_batch_size is not None and batching.min_batch_size > limit:
                raise ValueError(
                    f"min_batch_size ({batching.min_batch_size}) exceeds max_batch_size ({limit})"
                )
            if cap is not None and cap > limit:
                raise ValueError(
                    f"dynamic_batching.max_batch ({cap}) exceeds max_batch_size ({limit}), "
                    "which also bounds a batch"
                )
        return self
