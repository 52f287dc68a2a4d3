"""TLS for both endpoints from ``server.tls`` (cert, key, optional client CA).

The files are read and checked once, before anything listens: a missing or unreadable
file, or a certificate and key that do not belong together, stops start-up with a
message naming the key. HTTP gets an :class:`ssl.SSLContext` for uvicorn, gRPC its
server credentials; with ``client_ca`` both require a client certificate signed by it
(mutual TLS).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from sordino.config.server import TlsConfig
from sordino.errors import ConfigError

__all__ = ["TlsMaterial", "load_tls"]


def _read(path: Path, key: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"server.tls.{key}: cannot read {path} ({exc.strerror or exc}); give a readable "
            "PEM file"
        ) from None


@dataclass(frozen=True)
class TlsMaterial:
    """The PEM bytes of ``server.tls`` and the contexts built from them."""

    config: TlsConfig
    cert: bytes
    key: bytes
    client_ca: bytes | None

    def ssl_context(self) -> ssl.SSLContext:
        """The HTTP endpoint's server context (TLS 1.2 at least)."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(str(self.config.cert), str(self.config.key))
        except ssl.SSLError as exc:
            raise ConfigError(
                f"server.tls: the certificate {self.config.cert} and key {self.config.key} "
                f"cannot be used together ({exc.reason or exc}); give a PEM certificate and "
                "its private key"
            ) from None
        if self.config.client_ca is not None:
            try:
                context.load_verify_locations(cafile=str(self.config.client_ca))
            except ssl.SSLError as exc:
                raise ConfigError(
                    f"server.tls.client_ca: {self.config.client_ca} holds no usable CA "
                    f"certificate ({exc.reason or exc})"
                ) from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)],
            root_certificates=self.client_ca,
            require_client_auth=self.client_ca is not None,
        )


def load_tls(config: TlsConfig | None) -> TlsMaterial | None:
    """Read ``server.tls``'s files (None when TLS is off); raise ConfigError naming the key."""
    if config is None:
        return None
    material = TlsMaterial(
        config,
        _read(config.cert, "cert"),
        _read(config.key, "key"),
        _read(config.client_ca, "client_ca") if config.client_ca is not None else None,
    )
    material.ssl_context()  # a certificate and key that do not match fail here
    return material
