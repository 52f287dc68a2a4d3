"""grpc.aio's log of a call that ended before its answer went out, said in one line.

When a client's deadline passes (or it cancels, or its connection closes) just as the
server sends its answer, gRPC core fails the send, and grpc.aio logs it at ERROR with a
traceback from its Cython ("ExecuteBatchError raised in core by servicer method […]")
unless its own watcher had already seen the client go — a race the watcher loses now
and then: 79 of ~12,000 calls with a 0.5 ms deadline in a soak of ``sordino start``. The
call is over either way: the client has its DEADLINE_EXCEEDED or CANCELLED from its own
side, and there is nobody left to answer. Nothing is wrong with the server, so the
record becomes a one-line DEBUG record saying so, as Triton keeps such a call out of
its log; every other grpc.aio record passes unchanged.
"""

from __future__ import annotations

import logging

__all__ = ["CYGRPC_LOGGER", "quiet_unfinished_calls"]

CYGRPC_LOGGER = "grpc._cython.cygrpc"
"""The logger grpc.aio's server writes its per-call records to."""

_UNFINISHED = "ExecuteBatchError raised in core by servicer method"


class _UnfinishedCall(logging.Filter):
    """Turns grpc.aio's record of an answer core could not send into a DEBUG line."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(_UNFINISHED):
            return True
        method = message[len(_UNFINISHED) :].strip(" []")
        record.msg = (
            "gRPC call %s ended before its answer was sent (the client's deadline passed, "
            "it cancelled, or its connection closed)"
        )
        record.args = (method,)
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        record.exc_info = record.exc_text = None
        return record.levelno >= logging.getLogger(CYGRPC_LOGGER).getEffectiveLevel()


_FILTER = _UnfinishedCall()


def quiet_unfinished_calls() -> None:
    """Put the filter on grpc.aio's logger (once per process)."""
    logger = logging.getLogger(CYGRPC_LOGGER)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
