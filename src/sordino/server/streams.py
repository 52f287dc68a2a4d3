"""Open ``ModelStreamInfer`` streams per client address (``server.max_streams_per_client``).

gRPC multiplexes any number of streams over one connection, and a client may open
many connections; the HTTP listener's per-client connection limit does not see them.
:class:`StreamLimit` counts the streams each client address holds open across all its
connections; past the limit a new stream is refused with ``RESOURCE_EXHAUSTED`` naming
the key, and the client's open streams and every other client go on.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from sordino.errors import RateLimited

__all__ = ["StreamLimit", "peer_address"]

log = logging.getLogger(__name__)


def peer_address(peer: str) -> str:
    """The client address of a gRPC peer string (``ipv4:127.0.0.1:5050`` → ``127.0.0.1``).

    Streams from one address count together whatever their port; a peer that is not an
    IP address (a Unix socket) counts as itself.
    """
    scheme, _, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6") or ":" not in rest:
        return peer
    return rest.rpartition(":")[0].strip("[]")


class StreamLimit:
    """How many streams each client address holds open, bounded by ``per_client``."""

    def __init__(self, per_client: int) -> None:
        self.per_client = per_client
        self._open: Counter[str] = Counter()
        self.refused = 0
        """Streams refused so far for being past the limit."""

    def open_streams(self, client: str) -> int:
        """The streams ``client`` holds open now."""
        return self._open[client]

    @contextmanager
    def hold(self, client: str) -> Iterator[None]:
        """Count a stream of ``client`` while the block runs; raise if it is one too many."""
        if self._open[client] >= self.per_client:
            self.refused += 1
            log.warning(
                "refused a stream from %s: it holds %d (server.max_streams_per_client)",
                client,
                self._open[client],
            )
            raise RateLimited(
                f"{client} holds its limit of {self.per_client} open ModelStreamInfer streams; "
                "send more requests on the streams it has, or close some "
                "(server.max_streams_per_client)",
                retry_after_s=1.0,
            )
        self._open[client] += 1
        try:
            yield
        finally:
            self._open[client] -= 1
            if self._open[client] <= 0:
                del self._open[client]
