"""The accuracy guard of quantized models (``quant_guard.enabled``, ``--quant-aware true``).

At load, every model whose runtime hints say ``precision: int8`` (or ``int4``) is run on its
held-out sample next to its float reference (``operations/quantize.py``); a model
that strays past the bound is not served: its float reference is, under the same
name, and a ``quant_guard`` event and the ``sordino_quant_guard_fallbacks_total``
metric say so. Every ``quant_guard.interval`` the *served* quantized model is asked
the sample again through its scheduler (the real serving path) and compared with the
float outputs computed at load; a model that has gone wrong is replaced by its float
reference as a new version (loaded first, then the quantized one drains and unloads),
so no request is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge

from sordino.config.quant_guard import QuantGuardConfig
from sordino.errors import ModelLoadError
from sordino.events import EventSink
from sordino.memory.refs import Tensors
from sordino.models.hints import ModelHints, read_hints
from sordino.models.repository import ModelSource
from sordino.operations.quantize import (
    GuardFigures,
    compare_outputs,
    decode_sample,
    output_names,
    run_onnx,
)

__all__ = ["QuantGuard"]

log = logging.getLogger("sordino.quant_guard")


@dataclass(slots=True)
class _Guarded:
    source: ModelSource
    reference: ModelSource
    sample: dict[str, np.ndarray]
    expected: list[np.ndarray]
    output_names: list[str]
    bound: float


def _reference_path(source: ModelSource, reference: str) -> Path:
    """The float reference of ``source``: a file inside the quantized model's own folder.

    The hint was checked to be relative without ``..`` (``ModelHints``); resolving also
    catches a symbolic link that points out of the folder.
    """
    folder = source.path.resolve().parent
    path = (folder / reference).resolve()
    if not path.is_relative_to(folder):
        raise ModelLoadError(
            f"model {source.name}: runtime hint sordino.hints.float_reference={reference!r} "
            f"is refused: it leads out of the model's folder {folder}; put the float model "
            "beside the quantized one (sordino quantize does)"
        )
    return path


def _replay(
    source: ModelSource, reference: Path, sample: dict[str, np.ndarray]
) -> tuple[list[np.ndarray], list[str], GuardFigures]:
    """Run the sample through both models (blocking: call it in a thread)."""
    if not reference.is_file():
        raise ModelLoadError(
            f"model {source.name}: its float reference {reference} does not exist; the "
            "guard cannot check it (re-quantize, or start without --quant-aware)"
        )
    expected = run_onnx(reference, sample)
    figures = compare_outputs(run_onnx(source.path, sample), expected)
    names = output_names(reference)
    return expected, names, figures


class QuantGuard:
    """Screens quantized sources at load and re-checks the served ones periodically."""

    def __init__(
        self,
        config: QuantGuardConfig,
        *,
        events: EventSink,
        registry: CollectorRegistry,
        load: Callable[[ModelSource], Awaitable[object]],
        unload: Callable[[str, str], Awaitable[None]],
        run: Callable[[str, Mapping[str, np.ndarray]], Awaitable[Tensors]],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self.config = config
        self._events = events
        self._load, self._unload, self._run, self._sleep = load, unload, run, sleep
        self._guarded: dict[str, _Guarded] = {}
        self._task: asyncio.Task[None] | None = None
        self.checks = 0
        self._agreement = Gauge(
            "sordino_quant_guard_agreement",
            "Top-1 agreement of a quantized model with its float reference on its sample",
            ["model"],
            registry=registry,
        )
        self._error = Gauge(
            "sordino_quant_guard_max_abs_error",
            "Largest absolute output difference of a quantized model from its float reference",
            ["model"],
            registry=registry,
        )
        self._fallbacks = Counter(
            "sordino_quant_guard_fallbacks",
            "Times a quantized model was replaced by its float reference",
            ["model"],
            registry=registry,
        )

    async def screen(self, sources: Sequence[ModelSource]) -> list[ModelSource]:
        """The sources to load: a quantized one that strays past its bound becomes its float."""
        if not self.config.enabled:
            return list(sources)
        screened: list[ModelSource] = []
        for source in sources:
            hints = (
                await asyncio.to_thread(read_hints, source.path)
                if source.path.suffix == ".onnx"
                else None
            )
            if hints is None or hints.precision not in ("int8", "int4"):
                screened.append(source)
                continue
            screened.append(await self._screen_one(source, hints))
        return screened

    async def _screen_one(self, source: ModelSource, hints: ModelHints) -> ModelSource:
        if hints.float_reference is None or hints.guard_sample is None:
            raise ModelLoadError(
                f"model {source.name}: --quant-aware needs its float reference and a held-out "
                "sample in the model's hints (sordino quantize writes both); this model has "
                f"{'no float_reference' if hints.float_reference is None else 'no guard_sample'}"
            )
        try:
            sample = decode_sample(hints.guard_sample)
        except ValueError as exc:
            raise ModelLoadError(
                f"model {source.name}: runtime hint sordino.hints.guard_sample is refused: {exc}"
            ) from None
        reference_path = _reference_path(source, hints.float_reference)
        try:
            expected, names, figures = await asyncio.to_thread(
                _replay, source, reference_path, sample
            )
        except ModelLoadError:
            raise
        except Exception as exc:  # ONNX Runtime's own errors: a bad reference or sample
            reason = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            raise ModelLoadError(
                f"model {source.name}: the accuracy guard cannot run its float reference "
                f"{hints.float_reference!r} on the guard_sample hint: {reason}"
            ) from None
        reference = ModelSource(
            source.name, source.version, reference_path, source.config, source.description
        )
        bound = hints.accuracy_bound or self.config.min_agreement
        if self._judge(source.name, figures, bound, "load"):
            self._guarded[source.name] = _Guarded(source, reference, sample, expected, names, bound)
            return source
        return reference

    def _judge(self, model: str, figures: GuardFigures, bound: float, phase: str) -> bool:
        """Record ``figures``; return whether the quantized model may stay."""
        self.checks += 1
        self._agreement.labels(model).set(figures.agreement)
        self._error.labels(model).set(figures.max_abs_error)
        limit = self.config.max_abs_error
        problems = []
        if figures.agreement < bound:
            problems.append(f"top-1 agreement {figures.agreement:.1%} < {bound:.1%}")
        if limit is not None and figures.max_abs_error > limit:
            problems.append(f"max abs error {figures.max_abs_error:.4g} > {limit:.4g}")
        kept = not problems
        if not kept:
            self._fallbacks.labels(model).inc()
            log.warning(
                "model %s: the quantized model strays from its float reference on %d held-out "
                "rows (%s): serving the float model instead",
                model,
                figures.rows,
                "; ".join(problems),
            )
        self._events.emit(
            "quant_guard",
            model,
            f"{phase}: " + ("; ".join(problems) + ": float served" if problems else "within bound"),
            phase=phase,
            action="kept" if kept else "fallback_to_float",
            bound=bound,
            **figures.to_json(),
        )
        return kept

    # -- the periodic check ------------------------------------------------------------

    def start(self) -> None:
        if self._guarded and self.config.interval > 0 and self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._periodic(), name="sordino-quant-guard"
            )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _periodic(self) -> None:
        while self._guarded:
            await self._sleep(self.config.interval)
            for name in list(self._guarded):
                try:
                    await self.check(name)
                except Exception:  # a failed check must not stop the guard
                    log.exception("quant guard: the check of %s failed", name)

    async def check(self, name: str) -> bool:
        """Ask the served model ``name`` its sample; fall back to float when it strayed."""
        guarded = self._guarded[name]
        outputs = await self._run(name, guarded.sample)
        try:
            served = [np.array(outputs[output]) for output in guarded.output_names]
        finally:
            outputs.release()
        figures = compare_outputs(served, guarded.expected)
        if self._judge(name, figures, guarded.bound, "periodic"):
            return True
        del self._guarded[name]
        source = guarded.source
        fallback = ModelSource(
            name,
            str(int(source.version) + 1) if source.version.isdigit() else source.version + "f",
            guarded.reference.path,
            source.config,
            source.description,
        )
        await self._load(fallback)
        await self._unload(name, source.version)
        return False
