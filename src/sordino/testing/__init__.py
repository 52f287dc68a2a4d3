"""Test doubles for code that uses sordino: a virtual clock, scripted backends.

These isolate what a test is about; they are never used by the runtime itself.
"""

from sordino.testing.backends import ScriptedExecutor
from sordino.testing.clock import VirtualClock

__all__ = ["ScriptedExecutor", "VirtualClock"]
