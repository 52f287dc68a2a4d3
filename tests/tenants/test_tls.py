"""TLS on both endpoints: tritonclient over HTTPS and gRPC with TLS, a certificate made here.

The certificate is self-signed, made by the ``openssl`` command (``cryptography`` is not a
dependency); the test is skipped where that command is missing.
"""

from __future__ import annotations

import contextlib
import gc
import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from sordino.config import load_config
from sordino.errors import ConfigError
from sordino.models.repository import builtin_sources
from sordino.server.http_protocol import HttpProtocol
from sordino.server.tls import load_tls
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def _certificate(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture(scope="module")
def pem(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return _certificate(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(pem: tuple[Path, Path]) -> Iterator[RunningServer]:
    cert, key = pem
    config = load_config(None, {"server": {"tls": {"cert": str(cert), "key": str(key)}}})
    sources = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(config, sources) as running:
        yield running


def _inputs(module: object) -> list[object]:
    made = []
    for name, data in (("INPUT0", np.arange(16)), ("INPUT1", np.ones(16))):
        tensor = module.InferInput(name, [1, 16], "INT32")  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(data.astype(np.int32).reshape(1, 16))
        made.append(tensor)
    return made


def test_tritonclient_over_https(server: RunningServer, pem: tuple[Path, Path]) -> None:
    assert server.url.startswith("https://")
    client = httpclient.InferenceServerClient(
        f"localhost:{server.port}",
        ssl=True,
        ssl_context_factory=lambda: ssl.create_default_context(cafile=str(pem[0])),
    )
    try:
        result = client.infer("simple", _inputs(httpclient))
        assert result.as_numpy("OUTPUT0").tolist() == [[i + 1 for i in range(16)]]
    finally:
        client.close()


def test_tritonclient_over_grpc_tls(server: RunningServer, pem: tuple[Path, Path]) -> None:
    client = grpcclient.InferenceServerClient(
        f"localhost:{server.grpc_port}", ssl=True, root_certificates=str(pem[0])
    )
    try:
        result = client.infer("simple", _inputs(grpcclient))
        assert result.as_numpy("OUTPUT1").tolist() == [[i - 1 for i in range(16)]]
    finally:
        client.close()


def test_plaintext_to_a_tls_port_fails_cleanly(
    server: RunningServer, pem: tuple[Path, Path]
) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{server.port}/v2/health/ready", timeout=5)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}")
    try:
        with pytest.raises(grpc.FutureTimeoutError):
            grpc.channel_ready_future(channel).result(timeout=2)
    finally:
        channel.close()
    # The server still serves TLS clients afterwards.
    ready = httpx.get(
        f"{server.url}/v2/health/ready", verify=ssl.create_default_context(cafile=str(pem[0]))
    )
    assert ready.status_code == 200


def test_bad_files_are_named(tmp_path: Path, pem: tuple[Path, Path]) -> None:
    config = load_config(
        None, {"server": {"tls": {"cert": str(tmp_path / "missing.pem"), "key": str(pem[1])}}}
    )
    with pytest.raises(ConfigError, match=r"server.tls.cert: cannot read"):
        load_tls(config.server.tls)
    other_cert, _ = _certificate(tmp_path)
    config = load_config(None, {"server": {"tls": {"cert": str(other_cert), "key": str(pem[1])}}})
    with pytest.raises(ConfigError, match="cannot be used together"):
        load_tls(config.server.tls)


def test_mutual_tls_wants_a_client_certificate(tmp_path: Path, pem: tuple[Path, Path]) -> None:
    cert, key = pem
    client_cert, client_key = _certificate(tmp_path)  # self-signed: its own CA
    tls = {"cert": str(cert), "key": str(key), "client_ca": str(client_cert)}
    config = load_config(None, {"server": {"tls": tls}})
    sources = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(config, sources) as running:
        url = f"{running.url}/v2/health/ready"
        trusted = ssl.create_default_context(cafile=str(cert))
        with pytest.raises(httpx.TransportError):
            httpx.get(url, verify=trusted, timeout=5)
        trusted.load_cert_chain(str(client_cert), str(client_key))
        assert httpx.get(url, verify=trusted, timeout=5).status_code == 200
        client = grpcclient.InferenceServerClient(
            f"localhost:{running.grpc_port}",
            ssl=True,
            root_certificates=str(cert),
            private_key=str(client_key),
            certificate_chain=str(client_cert),
        )
        try:
            assert client.is_server_ready()
        finally:
            client.close()


def _closed_after(port: int, first_bytes: bytes) -> float:
    """Seconds until the server closes a connection that stalls its TLS handshake."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as stalled:
        stalled.sendall(first_bytes)
        try:
            while stalled.recv(4096):  # whatever the server says, it must then close
                pass
        except ConnectionResetError:
            pass
    return time.monotonic() - started


def test_a_stalled_handshake_is_dropped_after_the_header_timeout(
    pem: tuple[Path, Path],
) -> None:
    cert, key = pem
    settings = {"tls": {"cert": str(cert), "key": str(key)}, "header_timeout": "1s"}
    config = load_config(None, {"server": settings})
    sources = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(config, sources) as running:
        # Silent after connecting, and a ClientHello cut after its record header: both
        # are dropped near the 1 s header timeout, not after asyncio's 60 s default.
        for first_bytes in (b"", b"\x16\x03\x01\x02\x00"):
            assert _closed_after(running.port, first_bytes) < 20
            assert _closed_after(running.grpc_port, first_bytes) < 20
        ready = httpx.get(
            f"{running.url}/v2/health/ready", verify=ssl.create_default_context(cafile=str(cert))
        )
        assert ready.status_code == 200


def test_pending_handshakes_count_against_the_per_client_limit(
    pem: tuple[Path, Path],
) -> None:
    """Connections that never finish their handshake hold descriptors: they count from
    the accept, so a client address cannot hold more than its limit that way."""
    cert, key = pem
    settings = {
        "tls": {"cert": str(cert), "key": str(key)},
        "max_connections_per_client": 3,
        "monitoring_connections": 0,
        "header_timeout": "60s",
    }
    config = load_config(None, {"server": settings})
    sources = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(config, sources) as running:
        verify = ssl.create_default_context(cafile=str(cert))
        stalled = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(3)]
        try:
            refused = httpx.get(f"{running.url}/v2/health/ready", verify=verify, timeout=10)
            assert refused.status_code == 503
            assert "max_connections_per_client" in refused.json()["error"]
        finally:
            for sock in stalled:
                sock.close()

        def served() -> bool:
            ready = httpx.get(f"{running.url}/v2/health/ready", verify=verify, timeout=10)
            return ready.status_code == 200

        wait_for(served, "a TLS client to be served once the stalled ones closed", 10)


def test_stalled_handshakes_leave_nothing_for_the_cyclic_gc(pem: tuple[Path, Path]) -> None:
    """A handshake that times out must free its TLS objects at once, not in a cycle."""
    cert, key = pem
    settings = {"tls": {"cert": str(cert), "key": str(key)}, "header_timeout": "0.5s"}
    config = load_config(None, {"server": settings})
    sources = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(config, sources) as running:
        gc.collect()
        gc.disable()
        try:
            stalled = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(20)]
            for sock in stalled[:10]:
                sock.sendall(b"\x16\x03\x01\x02\x00")  # a ClientHello cut short
            for sock in stalled:  # each is dropped after the 0.5 s header timeout
                with contextlib.suppress(ConnectionResetError):
                    assert sock.recv(4096) == b""
                sock.close()

            def retained() -> int:
                return sum(1 for o in gc.get_objects() if isinstance(o, HttpProtocol))

            wait_for(lambda: retained() == 0, "the stalled handshakes to be freed", 10)
        finally:
            gc.enable()
