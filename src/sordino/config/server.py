"""The ``server`` section: where the HTTP and gRPC front ends listen, and limits."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from sordino.config.base import ExpandedPath, Section
from sordino.config.trace import TraceConfig
from sordino.config.units import Duration, Size, parse_size

__all__ = ["MIN_TOKEN_LENGTH", "ModelControlMode", "ServerConfig", "TlsConfig"]

ModelControlMode = Literal["none", "explicit", "poll"]

MIN_TOKEN_LENGTH = 8
"""The shortest admin token accepted, from the config file or ``SORDINO_ADMIN_TOKEN``."""


class TlsConfig(Section):
    """TLS for both endpoints: the server's certificate and key (PEM), and optionally
    the CA whose client certificates it requires (mutual TLS)."""

    cert: ExpandedPath
    """The server's certificate chain (PEM)."""
    key: ExpandedPath
    """The certificate's private key (PEM)."""
    client_ca: ExpandedPath | None = None
    """CA certificates (PEM); when set, every client must present a certificate it signed."""


class ServerConfig(Section):
    """Where and how the HTTP and gRPC front ends listen."""

    host: str = Field(default="127.0.0.1", min_length=1)
    """Interface to bind; "0.0.0.0" listens on every interface."""
    http_port: int = Field(default=8000, ge=0, le=65535)
    """TCP port for the KServe v2 HTTP API; 0 picks a free port."""
    grpc_port: int = Field(default=8001, ge=0, le=65535)
    """TCP port for the KServe v2 gRPC API (inference.GRPCInferenceService); 0 picks a free port."""
    model_control_mode: ModelControlMode = "none"
    """Triton's model control: none (fixed set), explicit (load/unload API), poll (rescan)."""
    repository_poll_secs: Duration = Field(default=15.0, gt=0)
    """How often ``poll`` mode rescans the model repository."""
    data_dir: ExpandedPath = Field(default=Path("~/.sordino"), validate_default=True)
    """Where sordino keeps state (reports, caches); "~" is expanded."""
    max_request_size: Size = Field(default=parse_size("64MB"), ge=1)
    """Largest request body accepted; larger bodies get 413."""
    max_header_size: Size = Field(default=parse_size("64KiB"), ge=1024, le=parse_size("16MiB"))
    """Largest HTTP request line and headers accepted; larger: 431 and close."""
    exit_on_error: bool = True
    """A model that fails to load at start ends start-up (Triton's ``--exit-on-error``);
    false: it is left out (UNAVAILABLE in the repository index, with its error) and the
    others serve."""
    strict_readiness: bool = True
    """``/v2/health/ready`` only while every model left out at start has loaded since
    (Triton's ``--strict-readiness``); false: ready once start-up ends."""
    header_timeout: Duration = Field(default=10.0, gt=0)
    """Longest an HTTP client may take to send a request's headers, from connecting (or
    from the first byte of a later request); then the connection is closed."""
    body_timeout: Duration = Field(default=60.0, gt=0)
    """Longest a request body may take to arrive after its headers; then 408 and close."""
    body_min_rate: Size = Field(default=parse_size("1KiB"), ge=0, le=parse_size("1GiB"))
    """Slowest average rate (bytes per second) a request body may arrive at once
    ``body_rate_grace`` has passed since its headers; slower: 408 and close. 0 = off."""
    body_rate_grace: Duration = Field(default=10.0, gt=0, le=3600)
    """How long a body may arrive at any rate before ``body_min_rate`` applies."""
    max_pending_bodies: int = Field(default=256, ge=1, le=1_000_000)
    """HTTP connections that may wait for the rest of a request body at once; past it,
    the one that has waited longest is answered 408 and closed."""
    max_pending_body_size: Size = Field(default=parse_size("1GiB"), ge=1)
    """Bytes of request bodies still arriving that the server holds, over all HTTP
    connections (each front-end process an equal share, at least ``max_request_size``);
    past it, the connections that have waited longest for the rest of theirs are answered
    408 and closed, so that bodies sent but for their end cannot fill the memory."""
    max_stream_backlog: Size = Field(default=parse_size("64MiB"), ge=1)
    """Bytes of responses one streaming request (a decoupled model's) may have waiting
    while its client does not read them; past it, the request is ended with an error
    and its model told it is cancelled, so that a client that stops reading cannot make
    the server hold everything the model sends."""
    max_total_stream_backlog: Size = Field(default=parse_size("1GiB"), ge=1)
    """The same bound over every streaming request of the server together: the request
    whose response would pass it is ended."""
    monitoring_connections: int = Field(default=8, ge=0, le=1024)
    """Connections kept past ``max_connections`` and ``max_connections_per_client`` for
    ``GET /metrics`` and ``/v2/health/*`` only; other requests on them get the 503."""
    keep_alive_timeout: Duration = Field(default=30.0, gt=0)
    """How long an idle keep-alive HTTP connection stays open between requests."""
    shed_loop_lag: Duration = Field(default=0.01, ge=0)
    """Refuse HTTP inference requests whose X-Sordino-Priority is below the highest
    level, from their headers, while the server's event loop runs later than this for
    100 ms at a stretch (CoDel-style); 0 = off. See docs/http-api.md."""
    max_connections: int | None = Field(default=None, ge=1)
    """Open HTTP connections at most; past it a new one is answered 503 and closed (and
    as many gRPC ones, past which gRPC core closes a new one). None: the open-file limit
    less 256 descriptors (kept for workers, files)."""
    max_connections_per_client: int = Field(default=1024, ge=1)
    """Open HTTP connections one client address may hold; past it its new connections
    are answered 503 and closed (other clients are still served)."""
    max_streams_per_client: int = Field(default=256, ge=1)
    """Open gRPC ``ModelStreamInfer`` streams one client address may hold, over all its
    connections; past it a new stream is refused with RESOURCE_EXHAUSTED."""
    max_requests_per_stream: int = Field(default=256, ge=1)
    """Requests of one gRPC ``ModelStreamInfer`` stream in progress at once; past it the
    stream's next message is read once one is answered (the client's sends wait in
    gRPC's flow control), so a client that sends without reading cannot grow memory."""
    grpc_accept_ahead: int = Field(default=32, ge=1, le=4096)
    """gRPC calls requested from gRPC core ahead of their arrival, so that calls arriving
    while the event loop is busy are all accepted in one turn (server/grpc_accept.py);
    1 = grpc.aio's own one at a time."""
    response_cache_size: Size | None = Field(default=None, ge=1)
    """Bytes of answers kept for the models that enable ``response_cache`` (Triton's
    ``local`` cache; flag ``--cache-config local,size=BYTES``); None: no cache, and such
    models run every request, as on Triton without ``--cache-config``."""
    trace: TraceConfig = Field(default_factory=TraceConfig)
    """Triton's request tracing (``--trace-config``; docs/observability.md)."""
    shutdown_timeout: Duration = 30.0
    """How long a graceful stop waits for in-flight requests before cancelling them."""
    tls: TlsConfig | None = None
    """TLS for HTTP (https://) and gRPC; absent: plain text (docs/security.md)."""
    frontends: int | None = Field(default=None, ge=1, le=256)
    """Processes that read client connections on the one HTTP and the one gRPC port: 1 =
    one process; N > 1 = N front-end processes (SO_REUSEPORT) and an engine process that
    reads none. None: from the cores (docs/configuration.md)."""
    admin_token: str | None = Field(default=None, min_length=MIN_TOKEN_LENGTH, repr=False)
    """Bearer token of the admin API and the protected endpoints (model control, profiling,
    the journal, the full telemetry view); env SORDINO_ADMIN_TOKEN if unset."""

    @model_validator(mode="after")
    def _pending_bodies_fit_a_request(self) -> ServerConfig:
        if self.max_pending_body_size < self.max_request_size:
            raise ValueError(
                f"server.max_pending_body_size ({self.max_pending_body_size} bytes) is smaller "
                f"than server.max_request_size ({self.max_request_size} bytes): a request of "
                "the largest size accepted could never arrive whole; raise "
                "max_pending_body_size to at least max_request_size"
            )
        return self

    @model_validator(mode="after")
    def _frontends_without_tls(self) -> ServerConfig:
        if self.frontends is not None and self.frontends > 1 and self.tls is not None:
            raise ValueError(
                "server.frontends > 1 with server.tls is not supported: a TLS session cannot "
                "move between processes; use server.frontends: 1 or end TLS at a proxy"
            )
        return self
