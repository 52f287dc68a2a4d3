"""Helpers for tests of a server with ``server.frontends: 2``: whose connection is whose
(read from the kernel, psutil), connections landing on one process, requests."""

from __future__ import annotations

import http.client
import json
import os
import socket
import time

import psutil

from sordino.testing import RunningServer


def frontend_pids(server: RunningServer) -> list[int]:
    """The front ends' pids and this process's (the engine's, on a test thread)."""
    assert server.frontends is not None
    return [*server.frontends.pids(), os.getpid()]


def owner(server: RunningServer, sock: socket.socket) -> int:
    """The pid of the process that holds ``sock``'s connection (this one: the engine)."""
    client_port = sock.getsockname()[1]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for pid in frontend_pids(server):
            try:
                held = psutil.Process(pid).net_connections(kind="tcp")
            except psutil.NoSuchProcess:
                continue
            if any(c.raddr and c.raddr.port == client_port for c in held):
                return pid
        time.sleep(0.01)
    raise AssertionError("no process accepted the connection")


def any_connection(server: RunningServer) -> http.client.HTTPConnection:
    """A new connection to ``server`` (whichever process accepts it)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    connection.connect()
    return connection


def connection_on(server: RunningServer, pid: int) -> http.client.HTTPConnection:
    """A connection that process ``pid`` accepted (new ones are tried until one is)."""
    for _ in range(200):
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        connection.connect()
        assert connection.sock is not None
        if owner(server, connection.sock) == pid:
            return connection
        connection.close()
    raise AssertionError(f"no connection landed on process {pid}")


def digits_body(seed: int = 0) -> bytes:
    """A JSON ``infer`` body for ``digits-classifier``: one row, varied by ``seed``."""
    pixels = [float((i * 7 + seed) % 17) for i in range(64)]
    return json.dumps(
        {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": pixels}]}
    ).encode()


def ask(
    connection: http.client.HTTPConnection,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, bytes, dict[str, str]]:
    """Send one request on ``connection``: its status, body and (lower-cased) headers."""
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    payload = response.read()
    return response.status, payload, {k.lower(): v for k, v in response.getheaders()}


def listening(process: psutil.Process | int, port: int) -> bool:
    """Whether ``process`` (a pid, or gone: False) listens on ``port``."""
    try:
        if isinstance(process, int):
            process = psutil.Process(process)
        held = process.net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in held)
