"""The ``quant_guard`` section: quantization-aware loading (``--quant-aware true``).

A quantized model whose runtime hints name its float reference and carry a held-out
sample (``sordino quantize`` writes both) is compared with that reference at load and
every ``interval``; when top-1 agreement falls below the bound (the model's
``accuracy_bound`` hint, else ``min_agreement``) or the largest absolute difference
passes ``max_abs_error``, the float model is served instead, with an event and a metric.
"""

from __future__ import annotations

from pydantic import Field

from sordino.config.base import Section
from sordino.config.units import Duration

__all__ = ["QuantGuardConfig"]


class QuantGuardConfig(Section):
    """Whether quantized models are guarded, how often, and how close they must stay."""

    enabled: bool = False
    """Guard every quantized model that carries a float reference (``--quant-aware``)."""
    interval: Duration = Field(default=300.0, ge=0)
    """Re-check the served model on the sample this often (e.g. 5m); 0 = at load only."""
    min_agreement: float = Field(default=0.99, gt=0, le=1)
    """Least share of sample rows whose top-1 class matches the float model's."""
    max_abs_error: float | None = Field(default=None, gt=0)
    """Largest absolute difference of any output element allowed; none = not checked."""
