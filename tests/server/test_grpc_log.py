"""grpc.aio's record of a call whose answer could not be sent (``server/grpc_log.py``)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from grpc._cython import cygrpc

from sordino.server.grpc_accept import open_server
from sordino.server.grpc_log import CYGRPC_LOGGER

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def _log_as_grpc_aio(message: str) -> None:
    """Log what grpc.aio's ``_handle_exceptions`` logs: its logger, its words, the
    exception it caught (a real ``ExecuteBatchError``) as the traceback."""
    try:
        raise cygrpc.ExecuteBatchError('Failed "execute_batch": (SendMessageOperation,)')
    except cygrpc.ExecuteBatchError:
        logging.getLogger(CYGRPC_LOGGER).exception(message)


def _opened() -> None:
    async def main() -> None:
        server = open_server([], 8)
        await server.stop(None)

    asyncio.run(main())


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO])
def test_an_answer_core_could_not_send_is_one_debug_line(
    caplog: pytest.LogCaptureFixture, level: int
) -> None:
    """Once a server is open, the client-gone record is one DEBUG line with no traceback
    (before: an ERROR with grpc.aio's Cython traceback, for every such call)."""
    _opened()
    caplog.set_level(level)
    _log_as_grpc_aio(f"ExecuteBatchError raised in core by servicer method [{METHOD}]")
    records = [r for r in caplog.records if r.name == CYGRPC_LOGGER]
    if level == logging.INFO:
        assert records == []
        return
    [record] = records
    assert record.levelno == logging.DEBUG
    assert record.exc_info is None
    assert record.getMessage() == (
        f"gRPC call {METHOD} ended before its answer was sent (the client's deadline "
        "passed, it cancelled, or its connection closed)"
    )
    assert "Traceback" not in caplog.text


def test_other_grpc_aio_errors_pass_unchanged(caplog: pytest.LogCaptureFixture) -> None:
    _opened()
    caplog.set_level(logging.INFO)
    _log_as_grpc_aio(f"Unexpected [ValueError] raised by servicer method [{METHOD}]")
    [record] = [r for r in caplog.records if r.name == CYGRPC_LOGGER]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None
