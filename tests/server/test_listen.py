"""``listen.reserve_port``: the engine holds a port its front-end processes listen on."""

from __future__ import annotations

import socket

import pytest

from sordino.server.listen import bind_socket, reserve_port


def _stranger(port: int) -> socket.socket:
    """A socket as most servers bind one: SO_REUSEADDR, no SO_REUSEPORT."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


def test_a_reserved_port_takes_no_connection_and_its_front_ends_take_them_all() -> None:
    with reserve_port("127.0.0.1", 0, flag="--http-port") as held:
        port = held.getsockname()[1]
        with bind_socket("127.0.0.1", port, reuse_port=True) as front:
            front.setblocking(True)
            front.settimeout(10)
            for _ in range(8):
                with socket.create_connection(("127.0.0.1", port), timeout=10):
                    accepted, _ = front.accept()
                    accepted.close()
        # No listener left: a client is refused at once, not queued on the reservation.
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=10)
        with pytest.raises(OSError, match="--http-port"):
            reserve_port("127.0.0.1", port, flag="--http-port").close()  # a second server
        with pytest.raises(OSError):
            _stranger(port).close()  # another program cannot take it meanwhile
        with bind_socket("127.0.0.1", port, reuse_port=True):
            pass  # a front end that comes back can


def test_a_port_another_program_listens_on_cannot_be_reserved() -> None:
    with _stranger(0) as other:
        other.listen(1)
        with pytest.raises(OSError, match="--grpc-port"):
            reserve_port("127.0.0.1", other.getsockname()[1], flag="--grpc-port")
