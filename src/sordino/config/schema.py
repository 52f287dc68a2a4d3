"""The configuration schema: one frozen snapshot of everything sordino reads at start-up.

Every section forbids unknown keys (a typo must fail loudly, not fall back to a
default) and is frozen: a :class:`RuntimeConfig` is an immutable value that can be
shared between tasks and compared with a newer one on hot reconfiguration. Lists in
the file become tuples here for the same reason.

The per-model section speaks Triton's vocabulary (``max_batch_size``,
``dynamic_batching``, ``instance_group``, ``version_policy``) so that a Triton
``config.pbtxt`` translates key for key. ``docs/configuration.md`` is the reference.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from sordino.config.threshold import parse_threshold
from sordino.config.units import Duration, Milliseconds, Size, parse_size
from sordino.errors import ConfigError

__all__ = [
    "EXECUTION_PROVIDERS",
    "STRATEGY_NAMES",
    "AllVersions",
    "DeviceConfig",
    "DynamicBatchingConfig",
    "DynamicBatchingStrategy",
    "FallbackChainStrategy",
    "LatestVersions",
    "ModelConfig",
    "ModelControlMode",
    "PriorityRule",
    "QueuePolicy",
    "RuntimeConfig",
    "SchedulerConfig",
    "SchedulerMode",
    "ServerConfig",
    "SpecificVersions",
    "Strategy",
    "StreamPriorityStrategy",
    "StreamingConfig",
    "TelemetryConfig",
    "VersionPolicy",
    "WorkersConfig",
]

SchedulerMode = Literal["auto", "manual", "hybrid", "adaptive", "conservative", "ultra_low_latency"]

STRATEGY_NAMES = ("dynamic_batching", "stream_priority", "fallback_chain")

EXECUTION_PROVIDERS: Mapping[str, str] = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
    "openvino": "OpenVINOExecutionProvider",
    "dml": "DmlExecutionProvider",
}
"""Short alias -> ONNX Runtime provider name; either spelling is accepted."""

ExpandedPath = Annotated[Path, AfterValidator(lambda path: path.expanduser())]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# --- server -------------------------------------------------------------------------------


ModelControlMode = Literal["none", "explicit", "poll"]


class ServerConfig(_Section):
    """Where and how the HTTP and gRPC front ends listen."""

    host: str = Field(default="127.0.0.1", min_length=1)
    """Interface to bind; "0.0.0.0" listens on every interface."""
    http_port: int = Field(default=8000, ge=0, le=65535)
    """TCP port for the KServe v2 HTTP API; 0 picks a free port."""
    grpc_port: int = Field(default=8001, ge=0, le=65535)
    """TCP port for the KServe v2 gRPC API (inference.GRPCInferenceService); 0 picks a free port."""
    model_control_mode: ModelControlMode = "none"
    """Triton's model control: none (fixed set), explicit (load/unload API), poll (rescan)."""
    repository_poll_secs: Duration = Field(default=15.0, gt=0)
    """How often ``poll`` mode rescans the model repository."""
    data_dir: ExpandedPath = Field(default=Path("~/.sordino"), validate_default=True)
    """Where sordino keeps state (reports, caches); "~" is expanded."""
    max_request_size: Size = Field(default=parse_size("64MB"), ge=1)
    """Largest request body accepted; larger bodies get 413."""
    shutdown_timeout: Duration = 30.0
    """How long a graceful stop waits for in-flight requests before cancelling them."""
    admin_token: str | None = Field(default=None, min_length=8, repr=False)
    """Bearer token of the admin API (/v2/admin/...); env SORDINO_ADMIN_TOKEN if unset."""


# --- telemetry ----------------------------------------------------------------------------


class TelemetryConfig(_Section):
    """The per-second time series, the SQLite journal under ``server.data_dir``, forecasts."""

    journal: bool = True
    """Record the time series and events in ``<data_dir>/<journal_file>`` (SQLite, WAL)."""
    journal_file: str = Field(default="journal.sqlite3", min_length=1)
    """File name of the journal inside ``server.data_dir``."""
    retention: Duration = Field(default=7 * 86400.0, gt=0)
    """How long journal rows are kept; older ones are pruned in the background."""
    flush_interval: Duration = Field(default=1.0, gt=0, le=10)
    """How often the journal writer commits; a crash loses at most this much."""
    recent_window: Duration = Field(default=900.0, ge=60)
    """How much of the series is kept in memory for /dashboard and ``sordino monitor``."""
    forecast: bool = True
    """Forecast the next hour's QPS and memory from the journal (needs statsmodels)."""
    forecast_interval: Duration = Field(default=300.0, ge=10)
    """How often the forecast is refitted."""


# --- scheduler strategies -----------------------------------------------------------------


def _check_priority(value: object) -> object:
    if isinstance(value, str) and value in ("high", "normal", "low"):
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    raise ValueError("priority must be 'high', 'normal', 'low', or an integer >= 1 (1 is highest)")


class PriorityRule(_Section):
    """Requests carrying ``tag`` are queued at ``priority``."""

    tag: str
    """The request tag this rule matches (exact match)."""
    priority: Annotated[int | Literal["high", "normal", "low"], BeforeValidator(_check_priority)]
    """'high', 'normal', 'low', or a level >= 1 where 1 is the highest."""

    @field_validator("tag")
    @classmethod
    def _tag_not_blank(cls, tag: str) -> str:
        if not tag.strip():
            raise ValueError("tag must not be empty")
        return tag


class DynamicBatchingStrategy(_Section):
    """Server-wide batching defaults; a model's ``dynamic_batching`` section overrides them."""

    name: Literal["dynamic_batching"]
    enabled: bool = True
    """False runs every request alone (batch size 1)."""
    min_batch: int = Field(default=1, ge=1)
    """Smallest batch worth running before ``timeout_ms`` has passed."""
    max_batch: int = Field(default=32, ge=1)
    """Largest batch formed; a model's ``max_batch_size`` caps it further."""
    timeout_ms: Milliseconds = Field(default=10.0, ge=0)
    """Longest the oldest queued request waits for a batch to fill."""
    preferred_batch: tuple[int, ...] = ()
    """Batch sizes to form when possible; each between ``min_batch`` and ``max_batch``."""

    @field_validator("max_batch")
    @classmethod
    def _max_not_below_min(cls, max_batch: int, info: ValidationInfo) -> int:
        min_batch = info.data.get("min_batch")
        if min_batch is not None and min_batch > max_batch:
            raise ValueError(f"min_batch ({min_batch}) is larger than max_batch ({max_batch})")
        return max_batch

    @field_validator("preferred_batch")
    @classmethod
    def _preferred_in_range(cls, sizes: tuple[int, ...], info: ValidationInfo) -> tuple[int, ...]:
        low, high = info.data.get("min_batch"), info.data.get("max_batch")
        if low is None or high is None:
            return sizes  # min_batch/max_batch already failed; that error is the useful one
        outside = [size for size in sizes if not low <= size <= high]
        if outside:
            raise ValueError(
                f"preferred batch sizes {outside} are outside min_batch..max_batch ({low}..{high})"
            )
        return sizes


class StreamPriorityStrategy(_Section):
    """Maps request tags to queue priorities."""

    name: Literal["stream_priority"]
    rules: tuple[PriorityRule, ...]
    """Checked in order; each tag may appear once."""

    @field_validator("rules")
    @classmethod
    def _tags_unique(cls, rules: tuple[PriorityRule, ...]) -> tuple[PriorityRule, ...]:
        tags = [rule.tag for rule in rules]
        repeated = sorted({tag for tag in tags if tags.count(tag) > 1})
        if repeated:
            raise ValueError(f"tags {repeated} have more than one rule; give each tag one priority")
        return rules


class FallbackChainStrategy(_Section):
    """Device fallback chain: every model runs on ``primary``, then on each fallback in order.

    Each device has a circuit breaker that opens when ``switch_threshold`` holds over
    its window (with at least ``min_requests`` batches in it), sends traffic down the
    chain while open, and lets ``half_open_probes`` batches test the device after
    ``cooldown`` before closing again.
    """

    name: Literal["fallback_chain"]
    primary: str
    """Name of the device (from ``devices``) that serves while it is healthy."""
    fallbacks: tuple[str, ...] = Field(min_length=1)
    """Devices to use, in order, while the ones before them are failing or missing."""
    switch_threshold: str = "error_rate>5% for 30s"
    """When a device's breaker opens: '<metric> <op> <value> for <window>'."""
    min_requests: int = Field(default=10, ge=1)
    """Batches a window must hold before the threshold may open the breaker."""
    cooldown: Duration = 5.0
    """How long an open breaker waits before half-open probes test the device again."""
    half_open_probes: int = Field(default=3, ge=1)
    """Consecutive successful probe batches that close the breaker again."""

    @field_validator("switch_threshold")
    @classmethod
    def _parsable(cls, text: str) -> str:
        try:
            parse_threshold(text)
        except ConfigError as exc:  # pydantic reports only ValueError as a validation error
            raise ValueError(str(exc)) from None
        return text

    @model_validator(mode="after")
    def _distinct(self) -> FallbackChainStrategy:
        chain = [self.primary, *self.fallbacks]
        repeated = sorted({name for name in chain if chain.count(name) > 1})
        if repeated:
            raise ValueError(f"devices {repeated} appear more than once in the chain")
        return self

    @property
    def chain(self) -> tuple[str, ...]:
        """Device names in order: the primary, then the fallbacks."""
        return (self.primary, *self.fallbacks)


Strategy = Annotated[
    DynamicBatchingStrategy | StreamPriorityStrategy | FallbackChainStrategy,
    Field(discriminator="name"),
]


class SchedulerConfig(_Section):
    """How queued requests become batches, server-wide."""

    mode: SchedulerMode = "adaptive"
    """Scheduling policy; a model's ``scheduler_mode`` overrides it."""
    slo_p99_ms: float = Field(default=100.0, gt=0)
    """Target 99th-percentile latency in milliseconds that adaptive modes steer towards."""
    strategies: tuple[Strategy, ...] = ()
    """Strategy sections, each ``name`` at most once."""

    @field_validator("strategies")
    @classmethod
    def _names_unique(cls, strategies: tuple[Strategy, ...]) -> tuple[Strategy, ...]:
        names = [strategy.name for strategy in strategies]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"strategies {repeated} are configured more than once; keep one each")
        return strategies

    @property
    def dynamic_batching(self) -> DynamicBatchingStrategy:
        """The configured ``dynamic_batching`` strategy, or its defaults when absent."""
        for strategy in self.strategies:
            if isinstance(strategy, DynamicBatchingStrategy):
                return strategy
        return DynamicBatchingStrategy(name="dynamic_batching")

    @property
    def fallback_chain(self) -> FallbackChainStrategy | None:
        """The ``fallback_chain`` strategy, or None when models run on one device."""
        for strategy in self.strategies:
            if isinstance(strategy, FallbackChainStrategy):
                return strategy
        return None

    @property
    def priority_rules(self) -> tuple[PriorityRule, ...]:
        """The ``stream_priority`` rules, or no rules when that strategy is absent."""
        for strategy in self.strategies:
            if isinstance(strategy, StreamPriorityStrategy):
                return strategy.rules
        return ()


# --- per-model ----------------------------------------------------------------------------


class QueuePolicy(_Section):
    """Triton's ``default_queue_policy``: deadlines and the size limit of a model's queue."""

    timeout_action: Literal["REJECT", "DELAY"] = "REJECT"
    """At the deadline: REJECT fails the request; DELAY keeps it but behind on-time ones."""
    default_timeout_microseconds: int = Field(default=0, ge=0)
    """Queue deadline per request; 0 means no deadline."""
    allow_timeout_override: bool = True
    """Whether a request may set its own (shorter or longer) queue deadline."""
    max_queue_size: int = 1024
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


class DynamicBatchingConfig(_Section):
    """Triton's ``dynamic_batching`` section; None inherits the scheduler's strategy."""

    preferred_batch_size: tuple[Annotated[int, Field(ge=1)], ...] = ()
    """Batch sizes to form when possible; empty inherits ``preferred_batch``."""
    max_queue_delay_microseconds: int | None = Field(default=None, ge=0)
    """Longest wait for a batch to fill; None inherits ``timeout_ms``."""
    min_batch_size: int | None = Field(default=None, ge=1)
    """Smallest batch worth running early (sordino extension); None inherits ``min_batch``."""
    priority_levels: int = Field(default=3, ge=1)
    """Number of priority levels; level 1 is served first."""
    default_priority_level: int = 2
    """Level of requests that ask for none; when omitted, the middle level."""
    default_queue_policy: QueuePolicy = QueuePolicy()

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


class LatestVersions(_Section):
    num_versions: int = Field(default=1, ge=1)
    """How many of the highest-numbered versions to serve."""


class AllVersions(_Section):
    pass


class SpecificVersions(_Section):
    versions: tuple[Annotated[int, Field(ge=1)], ...] = Field(min_length=1)
    """The version numbers to serve."""


class VersionPolicy(_Section):
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


class StreamingConfig(_Section):
    """Serve the model as a step model that streams one response per step.

    Each step's outputs are sent to the client; the outputs named in ``carry`` become
    the inputs of the next step, and the stream ends once the BOOL output ``done`` is
    true for every row (or after ``max_steps`` steps, which is an error).
    """

    carry: dict[str, str] = Field(min_length=1)
    """Output name -> the input it feeds on the next step."""
    done: str = Field(min_length=1)
    """A BOOL output; true ends the stream of that row."""
    max_steps: int = Field(default=1000, ge=1)
    """Most steps one request may take; a model still not done then fails the request."""


# Flat Triton keys that belong under dynamic_batching; ModelConfig moves them there.
_BATCHING_KEYS = (
    "preferred_batch_size",
    "max_queue_delay_microseconds",
    "priority_levels",
    "default_priority_level",
    "default_queue_policy",
    "min_batch_size",
)


def _provider_name(name: object) -> object:
    if not isinstance(name, str):
        return name
    valid = {full.lower(): full for full in EXECUTION_PROVIDERS.values()}
    valid.update(EXECUTION_PROVIDERS)
    if name.lower() in valid:
        return valid[name.lower()]
    choices = ", ".join([*EXECUTION_PROVIDERS, *EXECUTION_PROVIDERS.values()])
    raise ValueError(f"unknown execution provider {name!r}; valid: {choices}")


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


class ModelConfig(_Section):
    """One model: an explicit ``models:`` entry, or a repository folder's ``config.yaml``.

    In a repository, ``name`` and ``path`` come from the folder and may be omitted.
    Triton spellings are accepted as aliases (see :attr:`triton_aliases`).
    """

    triton_aliases: ClassVar[tuple[str, ...]] = ("platform", "instance_group", *_BATCHING_KEYS)
    """Keys accepted in the file that are folded into the fields below."""

    name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Model name used in URLs (/v2/models/<name>)."""
    path: ExpandedPath | None = None
    """An .onnx file, or a folder of numbered version folders (1/model.onnx, 2/...)."""
    backend: Literal["onnxruntime"] = "onnxruntime"
    """Runtime that executes the model; Triton's ``platform: onnxruntime_onnx`` means this."""
    max_batch_size: int | None = Field(default=None, ge=0)
    """Largest batch; None uses the scheduler's max_batch; 0 means never batch."""
    dynamic_batching: DynamicBatchingConfig = DynamicBatchingConfig()
    instance_count: int = Field(default=1, ge=1)
    """Model instances (sessions) run in parallel, on each device the model runs on."""
    instance_kind: Literal["cpu", "gpu", "auto"] = "auto"
    """Where instances run: cpu, gpu (CUDA devices ``gpus``), auto (``execution_providers``)."""
    gpus: tuple[Annotated[int, Field(ge=0)], ...] = ()
    """CUDA device ids for ``instance_kind: gpu``; empty means device 0."""
    isolation: Literal["process", "thread"] = "process"
    """process: each instance in its own worker process; thread: inside the server."""
    execution_providers: tuple[Annotated[str, BeforeValidator(_provider_name)], ...] = (
        "CPUExecutionProvider",
    )
    """ONNX Runtime providers in order of preference (aliases cpu, cuda, ... accepted)."""
    intra_op_threads: int | None = Field(default=None, ge=1)
    """Threads ONNX Runtime uses inside one operator; None lets ONNX Runtime decide."""
    scheduler_mode: SchedulerMode | None = None
    """Overrides ``scheduler.mode`` for this model."""
    version_policy: VersionPolicy = VersionPolicy(latest=LatestVersions())
    """Which numbered versions to serve; the highest one by default."""
    streaming: StreamingConfig | None = None
    """Run the model step by step, streaming a response per step; None: one response."""

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
    def _batching_fits_max_batch_size(self) -> ModelConfig:
        batching, limit = self.dynamic_batching, self.max_batch_size
        if limit == 0 and (batching.preferred_batch_size or batching.min_batch_size is not None):
            raise ValueError(
                "max_batch_size 0 means this model never batches, so preferred_batch_size "
                "and min_batch_size cannot apply; remove them or raise max_batch_size"
            )
        if limit:
            too_big = [size for size in batching.preferred_batch_size if size > limit]
            if too_big:
                raise ValueError(f"preferred_batch_size {too_big} exceeds max_batch_size {limit}")
            if batching.min_batch_size is not None and batching.min_batch_size > limit:
                raise ValueError(
                    f"min_batch_size ({batching.min_batch_size}) exceeds max_batch_size ({limit})"
                )
        return self


# --- devices and workers ------------------------------------------------------------------


class DeviceConfig(_Section):
    """One device a fallback chain can name: an ONNX Runtime provider and its settings."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    """Name used by ``fallback_chain`` and by chaos targets (``device:NAME``)."""
    provider: Annotated[str, BeforeValidator(_provider_name)] = "CPUExecutionProvider"
    """ONNX Runtime provider (aliases cpu, cuda, tensorrt, ... accepted)."""
    device_id: int = Field(default=0, ge=0)
    """Device index for CUDA/TensorRT providers; ignored for cpu."""
    intra_op_threads: int | None = Field(default=None, ge=1)
    """Threads per operator on this device; overrides the model's ``intra_op_threads``."""


class WorkersConfig(_Section):
    """How worker processes are watched, restarted and fed."""

    heartbeat_timeout: Duration = 10.0
    """A worker silent this long is hung: it is killed, its batch retried, it is restarted."""
    execution_timeout: Duration = 60.0
    """Longest one batch may run in a worker before the worker is replaced; 0 disables."""
    start_timeout: Duration = 120.0
    """Longest a worker may take to load its model and warm up."""
    restart_backoff: Duration = 1.0
    """Delay before the first restart; it doubles on each further failure."""
    restart_backoff_max: Duration = 60.0
    """The cap of the restart delay."""
    restart_backoff_reset: Duration = 600.0
    """A worker up this long without failing restarts with the first delay again."""
    warmup_batches: int = Field(default=1, ge=0)
    """Dummy batches a (re)started worker runs before it takes traffic."""
    shared_memory: Size = Field(default=parse_size("256MB"), ge=4096)
    """Size of the shared-memory arena that tensors travel through."""


# --- the whole file -----------------------------------------------------------------------


def _named_with_path(model: ModelConfig) -> ModelConfig:
    missing = [key for key in ("name", "path") if getattr(model, key) is None]
    if missing:
        raise ValueError(f"an entry of models needs {' and '.join(missing)}")
    return model


class RuntimeConfig(_Section):
    """Everything sordino reads at start-up; one immutable snapshot."""

    server: ServerConfig = ServerConfig()
    devices: tuple[DeviceConfig, ...] = ()
    """Named devices a ``fallback_chain`` strategy chains together."""
    scheduler: SchedulerConfig = SchedulerConfig()
    telemetry: TelemetryConfig = TelemetryConfig()
    models: tuple[Annotated[ModelConfig, AfterValidator(_named_with_path)], ...] = ()
    """Explicitly listed models; each needs ``name`` and ``path``."""
    model_repository: ExpandedPath | None = None
    """A Triton-style folder with one sub-folder per model."""
    workers: WorkersConfig = WorkersConfig()

    @model_validator(mode="after")
    def _poll_needs_repository(self) -> RuntimeConfig:
        if self.server.model_control_mode == "poll" and self.model_repository is None:
            raise ValueError(
                "server.model_control_mode poll rescans the model repository, but "
                "model_repository is not set; set it or use explicit"
            )
        return self

    @field_validator("models")
    @classmethod
    def _names_unique(cls, models: tuple[ModelConfig, ...]) -> tuple[ModelConfig, ...]:
        names = [model.name for model in models]
        repeated = sorted({str(name) for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"model names {repeated} are used more than once")
        return models

    @field_validator("devices")
    @classmethod
    def _device_names_unique(cls, devices: tuple[DeviceConfig, ...]) -> tuple[DeviceConfig, ...]:
        names = [device.name for device in devices]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"device names {repeated} are used more than once")
        return devices

    @field_validator("scheduler")
    @classmethod
    def _chain_names_devices(
        cls, scheduler: SchedulerConfig, info: ValidationInfo
    ) -> SchedulerConfig:
        chain = scheduler.fallback_chain
        devices = info.data.get("devices")
        if chain is None or devices is None:
            return scheduler
        known = {device.name for device in devices}
        missing = [name for name in chain.chain if name not in known]
        if missing:
            declared = ", ".join(sorted(known)) or "none"
            raise ValueError(
                f"fallback_chain names devices {missing} that are not declared under "
                f"devices (declared: {declared}); add e.g. '- {{name: {missing[0]}, "
                "provider: cpu}' to devices"
            )
        return scheduler

    def device(self, name: str) -> DeviceConfig:
        """Return the device called ``name``."""
        for device in self.devices:
            if device.name == name:
                return device
        raise KeyError(name)
