"""The ``memory`` section: the shared-memory arena's allocator, defragmentation,
overflow protection and per-tenant quotas."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BeforeValidator, Field, field_validator, model_validator

from sordino.config.base import MAX_POOL_SIZE, MIN_POOL_SIZE, Section, reject_repeated_names
from sordino.config.units import Duration, Size, parse_size
from sordino.errors import ConfigError

__all__ = ["FrameworkMemoryConfig", "MemoryConfig", "MemoryStrategy", "QuotaConfig"]

MemoryStrategy = Literal["fragmentation_aware", "best_fit", "simple"]


_DAY = 86_400.0


def _pool_size(value: object) -> object:
    """``auto``, or a size between MIN_POOL_SIZE (64 KiB) and MAX_POOL_SIZE (1 TiB)."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int | str) or isinstance(value, bool):
        raise ValueError(f"invalid pool size {value!r}: give 'auto' or a size such as '2GB'")
    try:
        size = parse_size(value)
    except ConfigError as exc:
        raise ValueError(f"{exc.message}; or 'auto' (sized from the forecast peak)") from None
    if size < MIN_POOL_SIZE:
        raise ValueError(
            f"pool size {size} bytes is too small: at least {MIN_POOL_SIZE} bytes (64KB), or 'auto'"
        )
    if size > MAX_POOL_SIZE:
        raise ValueError(f"pool size {size} bytes is too large: at most {MAX_POOL_SIZE} (1TB)")
    return size


_MIN_DEFRAG_INTERVAL = 0.1


def _interval(value: float) -> float:
    """0 (off), or at least 100 ms: a defragmentation every millisecond would stall
    every batch (each run moves blocks while batches wait)."""
    if 0 < value < _MIN_DEFRAG_INTERVAL:
        raise ValueError(f"{value} s is too short: 0 (off) or at least 100ms (e.g. 5m)")
    return value


def _reuse_strategy(value: object) -> object:
    # The brief's "aggressive" reuse: give back the largest entry first (most bytes freed).
    return "largest" if value == "aggressive" else value


class QuotaConfig(Section):
    """At most ``max`` bytes of the arena in flight for ``tenant`` at once."""

    tenant: str = Field(min_length=1, max_length=128)
    max: Size = Field(gt=0, le=MAX_POOL_SIZE)


class MemoryConfig(Section):
    """How the shared-memory arena hands out, moves, protects and shares its bytes."""

    enabled: bool = True
    """The memory manager (``--enable-memory-pool``/``--disable-memory-pool``): with
    false the arena is plain best fit with no defragmentation, overflow protection or
    quotas (and none of them may be set)."""
    strategy: MemoryStrategy = "best_fit"
    """fragmentation_aware (size tiers and lifetime classes), best_fit, or simple
    (bump pointer and free lists; the benchmark's baseline)."""
    pool_size: Annotated[int | Literal["auto"] | None, BeforeValidator(_pool_size)] = None
    """The arena's size; leave out to use workers.shared_memory. ``auto``: sized from
    the forecast peak between ``pool_min`` and ``pool_max``, grown ahead of a peak and
    shrunk after it (the segment is replaced at a quiet moment)."""
    pool_min: Size = Field(default=16 * 1024 * 1024, ge=MIN_POOL_SIZE, le=MAX_POOL_SIZE)
    """pool_size auto: the smallest the arena gets (and its size at start)."""
    pool_max: Size = Field(default=1024 * 1024 * 1024, ge=MIN_POOL_SIZE, le=MAX_POOL_SIZE)
    """pool_size auto: the largest the arena gets."""
    prewarm_interval: Duration = Field(default=30.0, ge=1, le=_DAY)
    """pool_size auto: how often the target size is worked out from the forecast."""
    prewarm_headroom: float = Field(default=1.5, ge=1.0, le=10.0)
    """pool_size auto: the target is this times the larger of the predicted peak and
    the peak seen since the last resize."""
    small_max: Size = Field(default=64 * 1024, ge=64, le=MAX_POOL_SIZE)
    """fragmentation_aware: blocks up to this size are the small tier."""
    medium_max: Size = Field(default=4 * 1024 * 1024, ge=64, le=MAX_POOL_SIZE)
    """fragmentation_aware: blocks up to this size (above small_max) are the medium tier."""
    compact_step: Size = Field(default=2 * 1024 * 1024, ge=0, le=1024**3)
    """fragmentation_aware: incremental compaction moves at most this many bytes of
    parked blocks at each batch boundary (a pause of about 1 ms per MiB); 0 = off."""
    defrag_interval: Annotated[Duration, AfterValidator(_interval)] = Field(
        default=0.0, ge=0, le=_DAY
    )
    """Defragment on this timer (e.g. 5m; 100ms to 1d); 0 = never on a timer."""
    defrag_threshold: float = Field(default=0.0, ge=0.0, le=1.0)
    """Also defragment when fragmentation stays above this for ``defrag_window`` (e.g.
    0.3); 0 = never (the default)."""
    defrag_window: Duration = Field(default=60.0, ge=1, le=_DAY)
    """How long fragmentation must stay above ``defrag_threshold``."""
    overflow_protection: bool = True
    """Estimate a batch's bytes before assembling it: shrink it to what the arena holds,
    wait up to ``overflow_wait`` for space, then answer 503 with Retry-After."""
    overflow_wait: Duration = Field(default=2.0, gt=0, le=600)
    """The longest a batch waits for arena space before its requests get 503."""
    reuse_strategy: Annotated[
        Literal["lru", "lfu", "largest"], BeforeValidator(_reuse_strategy)
    ] = "lru"
    """What the framework-side caches (the generation result and state caches) give
    back first when full: the least recently used entry, the least frequently used one,
    or the largest one. ``aggressive`` is ``largest``: each eviction frees the most
    bytes, so a tight pool is reused soonest."""
    quotas: tuple[QuotaConfig, ...] = ()
    """Per-tenant limits on arena bytes in flight; a tenant over its quota waits up to
    ``quota_wait``, then gets 429. Tenants without an entry are not limited."""
    quota_wait: Duration = Field(default=1.0, ge=0, le=600)
    """How long a request over its tenant's quota waits for room before 429; 0 = refuse at once."""
    zero_on_free: bool | None = None
    """Zero every released block before it is handed out again; default: on when
    quotas are set."""

    @field_validator("quotas")
    @classmethod
    def _tenants_unique(cls, quotas: tuple[QuotaConfig, ...]) -> tuple[QuotaConfig, ...]:
        reject_repeated_names((q.tenant for q in quotas), what="quota tenants")
        return quotas

    @model_validator(mode="after")
    def _coherent(self) -> MemoryConfig:
        if self.medium_max < self.small_max:
            raise ValueError(
                f"memory.medium_max ({self.medium_max} bytes) is below memory.small_max "
                f"({self.small_max} bytes); the medium tier starts where the small one ends"
            )
        if self.pool_max < self.pool_min:
            raise ValueError(
                f"memory.pool_max ({self.pool_max} bytes) is below memory.pool_min "
                f"({self.pool_min} bytes); pool_size auto grows between the two"
            )
        if not self.enabled:
            set_keys = sorted(
                key
                for key in (
                    "quotas",
                    "defrag_interval",
                    "defrag_threshold",
                    "strategy",
                    "pool_size",
                )
                if key in self.model_fields_set
                and getattr(self, key) not in ((), 0.0, "best_fit")
                and (key != "pool_size" or self.pool_size == "auto")
            )
            if set_keys:
                raise ValueError(
                    f"memory.enabled is false (--disable-memory-pool), but {', '.join(set_keys)} "
                    "need the memory manager: enable it or remove them"
                )
        return self

    @property
    def auto_pool(self) -> bool:
        """Whether the arena is sized from the forecast (``pool_size: auto``)."""
        return self.enabled and self.pool_size == "auto"

    def initial_pool(self, default: int) -> int:
        """The arena's size at start: ``pool_size``, ``pool_min`` for ``auto``, or
        ``default`` (``workers.shared_memory``)."""
        if self.pool_size == "auto":
            return self.pool_min
        return self.pool_size if self.pool_size is not None else default

    @property
    def zeroes_on_free(self) -> bool:
        """Whether released blocks are zeroed (explicit setting, else: quotas are set)."""
        return self.zero_on_free if self.zero_on_free is not None else bool(self.quotas)

    def quota(self, tenant: str) -> int | None:
        """The quota of ``tenant`` in bytes, or None when it has none."""
        for entry in self.quotas:
            if entry.tenant == tenant:
                return entry.max
        return None


ArenaExtendStrategy = Literal["kNextPowerOfTwo", "kSameAsRequested"]
EXTEND_STRATEGIES: dict[str, int] = {"kNextPowerOfTwo": 0, "kSameAsRequested": 1}
"""ONNX Runtime's numbers for ``arena_extend_strategy``."""


class FrameworkMemoryConfig(Section):
    """A model's ``framework_memory``: ONNX Runtime's arenas inside its worker process.

    Applies to ``isolation: process`` and to Ray actors (each worker or actor is one
    process with its own ONNX Runtime); a thread-isolated model shares the server's and
    accepts only the defaults.
    """

    cpu_arena: bool = True
    """ONNX Runtime's CPU memory arena (``enable_cpu_mem_arena``)."""
    arena_extend_strategy: ArenaExtendStrategy = "kNextPowerOfTwo"
    """How the CPU arena grows: kNextPowerOfTwo (ONNX Runtime's default) or
    kSameAsRequested (only what a tensor needs; less memory held after a peak)."""
    arena_max: Size = Field(default=0, le=MAX_POOL_SIZE)
    """The CPU arena's limit in bytes; 0 = none."""
    shrink_after_rows: int = Field(default=0, ge=0)
    """After a batch of at least this many rows, give the CPU arena's unused chunks
    back (run option ``memory.enable_memory_arena_shrinkage``); 0 = never."""
    gpu_mem_limit: Size | None = Field(default=None, le=MAX_POOL_SIZE)
    """CUDA execution provider: its arena's limit in bytes (``gpu_mem_limit``)."""
    gpu_arena_extend_strategy: ArenaExtendStrategy | None = None
    """CUDA execution provider: how its arena grows (``arena_extend_strategy``)."""

    @model_validator(mode="after")
    def _needs_the_arena(self) -> FrameworkMemoryConfig:
        if not self.cpu_arena:
            set_keys = sorted(
                key
                for key in ("arena_extend_strategy", "arena_max", "shrink_after_rows")
                if key in self.model_fields_set
            )
            if set_keys:
                raise ValueError(
                    f"cpu_arena is false, but {', '.join(set_keys)} configure the CPU arena: "
                    "turn cpu_arena on or remove them"
                )
        return self

    @property
    def custom_cpu_arena(self) -> bool:
        """Whether the CPU arena differs from ONNX Runtime's own (an arena of our own)."""
        return self.cpu_arena and (
            self.arena_extend_strategy != "kNextPowerOfTwo" or self.arena_max > 0
        )

    @property
    def is_default(self) -> bool:
        return self == FrameworkMemoryConfig()

    def describe_cpu(self) -> str:
        """The CPU arena's settings in words (what ``sordino memory status`` shows)."""
        if not self.cpu_arena:
            return "off"
        parts = ["on", self.arena_extend_strategy]
        if self.arena_max:
            parts.append(f"max {self.arena_max} bytes")
        if self.shrink_after_rows:
            parts.append(f"shrunk after batches of {self.shrink_after_rows}+ rows")
        return ", ".join(parts)

    def describe_gpu(self, providers: tuple[str, ...]) -> str:
        """The CUDA arena's settings, or "absent" without the CUDA execution provider."""
        if "CUDAExecutionProvider" not in providers:
            return "absent"
        parts = ["CUDA EP"]
        if self.gpu_mem_limit is not None:
            parts.append(f"gpu_mem_limit {self.gpu_mem_limit} bytes")
        if self.gpu_arena_extend_strategy is not None:
            parts.append(self.gpu_arena_extend_strategy)
        return ", ".join(parts)
