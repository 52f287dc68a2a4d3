"""The HTTP listening socket: bound before anything starts, so a port in use is one clear
error and ``port 0`` gives a free port that is known before the first request.

Light on purpose: a front-end process (``server/frontend_main.py``) binds its socket with
it without importing the rest of the server.

With front-end processes (``server.frontends`` > 1) the engine holds each port with
:func:`reserve_port`: a socket bound with ``SO_REUSEPORT`` and never listened on. Linux
looks a new connection up among *listening* sockets only, so the reservation takes none
(they all go to the front ends' listeners), yet it fixes the port (``port 0`` resolved
before any front end starts) and keeps it while every front end is restarting: another
program cannot bind it then, and a client is refused at once (RST) rather than
connecting to something else.
"""

from __future__ import annotations

import errno
import socket

__all__ = ["bind_socket", "check_port", "reserve_port"]


def _bound(
    host: str,
    port: int,
    flag: str,
    what: str,
    *,
    reuse_port: bool = False,
    reuse_addr: bool = True,
) -> socket.socket:
    """A socket bound to ``host:port`` (not listening); OSError naming ``flag`` if taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    if reuse_addr:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen{what} on {host}:{port}: {_advice(exc, host, flag)}") from exc
    return sock


def _advice(exc: OSError, host: str, flag: str) -> str:
    """Why a bind failed, and what to change: the port, or the host."""
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return (
            f"{exc.strerror} (this machine has no address {host}); give --host one of its "
            "own addresses: 127.0.0.1 for this machine only, 0.0.0.0 for all of them"
        )
    if exc.errno == errno.EACCES:
        return f"{exc.strerror} (a port below 1024 needs privileges); pick another with {flag}"
    return f"{exc.strerror}; pick another port with {flag} (0 picks a free one)"


def bind_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """Bind and listen on ``host:port`` (0 = any free port) with TCP_NODELAY set.

    Linux copies TCP_NODELAY from the listening socket to accepted connections, and
    the event loop sets it on each transport too: small responses are never delayed
    by Nagle's algorithm. A port in use raises OSError naming ``--http-port``.
    ``reuse_port`` sets SO_REUSEPORT: the front-end processes of one server all bind
    the port, and the kernel spreads new connections over them.
    """
    sock = _bound(host, port, "--http-port", "", reuse_port=reuse_port)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def reserve_port(host: str, port: int, *, flag: str, what: str = "") -> socket.socket:
    """Hold ``host:port`` (0 = any free port) for front-end processes; never listened on.

    The socket has ``SO_REUSEPORT``, so the front ends (same user, ``SO_REUSEPORT`` too)
    bind and listen on the same port; as it never listens, it takes no connection. It
    is bound without ``SO_REUSEADDR`` when it can be: with it, a program that sets only
    ``SO_REUSEADDR`` (most servers) could bind the port beside a socket that is not
    listening. Only where that fails (the port's connections of an earlier,
    single-process run still in TIME_WAIT) is it bound with ``SO_REUSEADDR``, as a
    listener would be. A port in use raises OSError naming ``flag`` — another
    server's reservation or front ends included: ``SO_REUSEPORT`` alone would let a
    second server of the same user share the port, so a plain bind is tried first.
    """
    check_port(host, port, flag=flag, what=what)
    try:
        return _bound(host, port, flag, what, reuse_port=True, reuse_addr=False)
    except OSError:
        return _bound(host, port, flag, what, reuse_port=True)


def check_port(host: str, port: int, *, flag: str, what: str = "") -> None:
    """Raise OSError naming ``flag`` if ``host:port`` cannot be bound now (0 always can).

    For a listener that binds through a library which would only log the failure
    (gRPC): the check gives the same message as :func:`bind_socket`, before any
    model loads.
    """
    if port != 0:
        _bound(host, port, flag, what).close()
