"""Calls requested from gRPC core ahead (``server/grpc_accept.py``), on real grpc.aio."""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest

from sordino.config.server import ServerConfig
from sordino.server.grpc_accept import AcceptAhead, accept_ahead_supported, open_server

pytestmark = pytest.mark.skipif(
    not accept_ahead_supported(), reason="this grpcio has no accept-ahead hook"
)

METHOD = "/test.Echo/Call"


def _handler(held: asyncio.Event | None = None) -> Any:
    async def echo(request: bytes, context: Any) -> bytes:
        if held is not None:
            await held.wait()
        return request

    return grpc.method_handlers_generic_handler(
        "test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)}
    )


async def _serve(ahead: int, held: asyncio.Event | None = None) -> tuple[Any, str]:
    server = open_server([("grpc.so_reuseport", 0)], ahead)
    server.add_generic_rpc_handlers((_handler(held),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def test_ahead_one_is_grpc_aio_own_server() -> None:
    async def main() -> None:
        server = open_server([], 1)
        assert not isinstance(server._server, AcceptAhead)
        await server.stop(None)

    asyncio.run(main())


def test_many_calls_at_once_are_all_answered() -> None:
    """More calls in flight than requests ahead: each is answered with its own bytes."""

    async def main() -> None:
        held = asyncio.Event()
        server, address = await _serve(4, held)
        assert isinstance(server._server, AcceptAhead)
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_unary(METHOD)
            pending = [asyncio.ensure_future(call(bytes([i]))) for i in range(40)]
            await asyncio.sleep(0.2)  # all 40 accepted and waiting in the handler
            held.set()
            assert await asyncio.gather(*pending) == [bytes([i]) for i in range(40)]
        await server.stop(1)

    asyncio.run(main())


def test_a_lone_call_is_answered() -> None:
    """Whichever of the outstanding requests core fills, the accept loop gets the call."""

    async def main() -> None:
        server, address = await _serve(16)
        async with grpc.aio.insecure_channel(address) as channel:
            call = channel.unary_unary(METHOD)
            for i in range(5):
                assert await asyncio.wait_for(call(b"x%d" % i), 10) == b"x%d" % i
        await server.stop(1)

    asyncio.run(main())


def test_stop_with_requests_outstanding_is_clean(caplog: pytest.LogCaptureFixture) -> None:
    """Stopping fails the requests still outstanding in core; nothing is logged for them."""

    async def main() -> None:
        server, address = await _serve(8)
        async with grpc.aio.insecure_channel(address) as channel:
            assert await channel.unary_unary(METHOD)(b"a") == b"a"
        await asyncio.wait_for(server.stop(1), 10)
        await asyncio.sleep(0.05)

    asyncio.run(main())
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


def test_config_default_and_bounds() -> None:
    assert ServerConfig().grpc_accept_ahead == 32
    with pytest.raises(ValueError):
        ServerConfig(grpc_accept_ahead=0)
