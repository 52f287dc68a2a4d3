"""What tests of sordino, and of code that embeds it, need.

- :class:`VirtualClock`: a :class:`sordino.clock.Clock` whose time moves only when the
  test advances it, so delays, deadlines and timers are tested without sleeping.
- :class:`ScriptedExecutor`: an executor whose model is a Python function, with a
  chosen latency and failures on demand; it records every batch, so a scheduler can be
  tested without a backend or a worker process.
- :func:`serve_in_thread`: real HTTP and gRPC servers on free loopback ports, in a
  background thread, yielding a :class:`RunningServer` for tests that use real clients.
- :mod:`sordino.testing.guardian`: scripted per-second rows, recording actions, and
  stand-ins for the memory manager's defragmenter and the step degrader, to test the
  guardian on virtual time.

Faults on a running server are injected with the real chaos API
(:class:`sordino.control.client.AdminClient`), not with a double. The runtime itself
never imports this package.
"""

from sordino.testing.backends import ScriptedExecutor
from sordino.testing.clock import VirtualClock
from sordino.testing.server import RunningServer, serve_in_thread

__all__ = ["RunningServer", "ScriptedExecutor", "VirtualClock", "serve_in_thread"]
