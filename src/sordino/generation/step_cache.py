"""Step caching (in the style of TeaCache): skip a denoiser call whose input barely moved.

Consecutive denoising steps see nearly the same input, and so predict nearly the same
noise; TeaCache (Liu et al., 2024) measures how far the input moved since the last
step the model ran and reuses that step's output while the accumulated change stays
small. Here the measure is the relative L1 change of the sample (the denoiser's
input), ``mean |x_k - x_{k-1}| / mean |x_{k-1}|``, summed over the steps since the
last computed one: while the sum stays under ``iterative.step_cache.threshold`` (and
no more than ``max_skips`` steps in a row have reused it), a step moves the sample
with the last computed noise prediction instead of queueing a model call. The first
step always runs (there is nothing to reuse) and so does the last (it gives the image).

With threshold 0 no step is ever skipped, so the image is bit-identical to the cache
off: the measure never feeds into the arithmetic of a step that runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sordino.config.iterative import StepCacheConfig

__all__ = ["StepCache", "StepCacheCounter", "StepCacheStatistics"]


@dataclass(frozen=True, slots=True)
class StepCacheStatistics:
    """A model's denoising steps so far: those the denoiser ran and those that reused one."""

    computed: int
    skipped: int


class StepCacheCounter:
    """Steps computed and skipped over every generation of one model (for ``/metrics``)."""

    def __init__(self) -> None:
        self.computed = 0
        self.skipped = 0

    def statistics(self) -> StepCacheStatistics:
        return StepCacheStatistics(self.computed, self.skipped)


class StepCache:
    """One generation's step cache: says whether its next step may reuse the last prediction."""

    def __init__(self, config: StepCacheConfig, counter: StepCacheCounter) -> None:
        self._config = config
        self._counter = counter
        self._previous: npt.NDArray[np.float32] | None = None
        self._accumulated = 0.0
        self._run = 0
        self.skipped = 0
        """Steps of this generation that reused a prediction."""

    def computed(self, sample: npt.NDArray[np.float32]) -> None:
        """A step ran the denoiser on ``sample``: its prediction is the one to reuse now."""
        self._counter.computed += 1
        if self._config.enabled:
            self._previous = sample
            self._accumulated = 0.0
            self._run = 0

    def may_skip(self, sample: npt.NDArray[np.float32], *, last: bool) -> bool:
        """Whether the step on ``sample`` may reuse the last prediction (counted if so).

        ``last``: the step is the generation's last one, which always runs.
        """
        config = self._config
        previous = self._previous
        if not config.enabled or previous is None or last:
            return False
        scale = float(np.mean(np.abs(previous)))
        change = float(np.mean(np.abs(sample - previous))) / max(scale, 1e-12)
        self._accumulated += change
        self._previous = sample
        if self._accumulated >= config.threshold or self._run >= config.max_skips:
            return False
        self._run += 1
        self.skipped += 1
        self._counter.skipped += 1
        return True
