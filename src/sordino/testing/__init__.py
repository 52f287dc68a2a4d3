"""Test doubles for code that uses sordino: a virtual clock, scripted backends.

These isolate what a test is about; they are never used by the runtime itself.
"""

from sordino.testing.backends import ScriptedExecutor
from sordino.testing.clock import VirtualClock
from sordino.testing.server import RunningServer, serve_in_thread

__all__ = ["RunningServer", "ScriptedExecutor", "VirtualClock", "serve_in_thread"]
