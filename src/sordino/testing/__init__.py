"""What tests of sordino, and of code that embeds it, need.

- :class:`VirtualClock`: a :class:`sordino.clock.Clock` whose time moves only when the
  test advances it, so delays, deadlines and timers are tested without sleeping.
- :class:`ScriptedExecutor`: an executor whose model is a Python function, with a
  chosen latency and failures on demand; it records every batch, so a scheduler can be
  tested without a backend or a worker process.
- :func:`fragment_arena`: drive a runtime's shared-memory arena to a fragmentation
  that defragmentation can undo (parked blocks with known contents).
- :func:`serve_in_thread`: real HTTP and gRPC servers on free loopback ports, in a
  background thread, yielding a :class:`RunningServer` for tests that use real clients.
- :func:`serve_tiny_kserve`: a tiny KServe v2 server that is not sordino (one model,
  no metrics), for clients that must work against any implementation.
- :mod:`sordino.testing.guardian`: scripted per-second rows, recording actions, and
  stand-ins for the memory manager's defragmenter and the step degrader, to test the
  guardian on virtual time.

Faults on a running server are injected with the real chaos API
(:class:`sordino.control.client.AdminClient`), not with a double. The runtime itself
never imports this package.
"""

from sordino.testing.backends import ScriptedExecutor
from sordino.testing.clock import VirtualClock
from sordino.testing.kserve import TinyKServe, serve_tiny_kserve
from sordino.testing.memory import Fragmentation, fragment_arena
from sordino.testing.server import RunningServer, serve_in_thread

__all__ = [
    "Fragmentation",
    "RunningServer",
    "ScriptedExecutor",
    "TinyKServe",
    "VirtualClock",
    "fragment_arena",
    "serve_in_thread",
    "serve_tiny_kserve",
]
