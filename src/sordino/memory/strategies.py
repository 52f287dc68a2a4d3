"""The allocator strategies by name, as ``memory.strategy`` chooses them.

``best_fit`` is the arena's original allocator (``allocator.py``), ``simple`` the
benchmark's baseline (``simple.py``), ``fragmentation_aware`` size tiers and
lifetime classes (``tiered.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

from sordino.memory.allocator import Allocator, Strategy
from sordino.memory.simple import SimpleAllocator
from sordino.memory.tiered import FragmentationAwareAllocator

__all__ = ["STRATEGIES", "StrategyName", "allocator_factory"]

StrategyName = Literal["fragmentation_aware", "best_fit", "simple"]
STRATEGIES: tuple[StrategyName, ...] = ("fragmentation_aware", "best_fit", "simple")


def allocator_factory(
    strategy: str, *, small_max: int = 64 * 1024, medium_max: int = 4 * 1024 * 1024
) -> Callable[[int], Strategy]:
    """A function that builds the ``strategy`` allocator over a capacity."""
    if strategy == "best_fit":
        return Allocator
    if strategy == "simple":
        return SimpleAllocator
    if strategy == "fragmentation_aware":
        return lambda capacity: FragmentationAwareAllocator(
            capacity, small_max=small_max, medium_max=medium_max
        )
    raise ValueError(f"unknown memory strategy {strategy!r}; use one of {', '.join(STRATEGIES)}")
