"""The rule of the protected endpoints, the admin token's length, the open-host warning."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.cli import start as start_command
from sordino.cli.main import cli
from sordino.config import ServerConfig
from sordino.control.admin import (
    TOKEN_ENV,
    AdminAccess,
    admin_token,
    exposure_warning,
    is_loopback,
)
from sordino.errors import ConfigError, Forbidden, Unauthenticated

TOKEN = "access-test-token"


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True), ("127.8.9.1", True), ("::1", True), ("[::1]", True),
        ("localhost", True), ("::ffff:127.0.0.1", True), ("0.0.0.0", False), ("::", False),
        ("10.1.2.3", False), ("example.org", False), ("", False), (None, False),
    ],
)  # fmt: skip
def test_loopback_addresses(host: str | None, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_with_a_token_everyone_needs_it() -> None:
    access = AdminAccess(TOKEN, "127.0.0.1")
    access.check(f"Bearer {TOKEN}", "10.0.0.7")
    access.check(f"bearer  {TOKEN} ", "127.0.0.1")
    for given in (None, "", "Bearer", "Bearer nope", f"Basic {TOKEN}", TOKEN):
        with pytest.raises(Unauthenticated):
            access.check(given, "127.0.0.1")


def test_without_a_token_only_loopback_clients_of_a_loopback_server() -> None:
    access = AdminAccess(None, "127.0.0.1")
    access.check(None, "127.0.0.1")
    access.check(None, "::1")
    with pytest.raises(Forbidden, match=r"set server\.admin_token"):
        access.check(None, "10.0.0.7")
    with pytest.raises(Forbidden):
        access.check(None, None)


def test_without_a_token_a_server_on_every_interface_refuses_everyone() -> None:
    """Bound to 0.0.0.0, a loopback peer may be a local proxy for anyone: refused."""
    access = AdminAccess(None, "0.0.0.0")
    for peer in ("127.0.0.1", "10.0.0.7"):
        with pytest.raises(Forbidden, match="the admin API is off"):
            access.check(None, peer)


def test_a_proxied_request_is_no_loopback_client() -> None:
    with pytest.raises(Forbidden):
        AdminAccess(None, "127.0.0.1").check(None, "127.0.0.1", proxied=True)


def _app(access: AdminAccess) -> Starlette:
    async def secret(request: Request) -> Response:
        return Response("ok")

    return Starlette(routes=[Route("/secret", access.protect(secret))])


async def _get(access: AdminAccess, client: tuple[str, int], **headers: str) -> httpx.Response:
    transport = httpx.ASGITransport(app=_app(access), client=client)
    async with httpx.AsyncClient(transport=transport, base_url="http://sordino") as http:
        return await http.get("/secret", headers=headers)


async def test_http_statuses_of_the_rule() -> None:
    loopback, remote = ("127.0.0.1", 5000), ("192.0.2.9", 5000)
    open_local = AdminAccess(None, "127.0.0.1")
    assert (await _get(open_local, loopback)).status_code == 200
    assert (await _get(open_local, remote)).status_code == 403
    proxied = await _get(open_local, loopback, **{"X-Forwarded-For": "192.0.2.9"})
    assert proxied.status_code == 403
    everywhere = await _get(AdminAccess(None, "0.0.0.0"), loopback)
    assert everywhere.status_code == 403
    assert TOKEN_ENV in everywhere.json()["error"]
    with_token = AdminAccess(TOKEN, "0.0.0.0")
    missing = await _get(with_token, remote)
    assert missing.status_code == 401 and missing.headers["WWW-Authenticate"] == "Bearer"
    assert (await _get(with_token, remote, Authorization=f"Bearer {TOKEN}")).status_code == 200


class _Context:
    def __init__(self, peer: str, metadata: tuple[tuple[str, Any], ...] = ()) -> None:
        self._peer, self._metadata = peer, metadata

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata


def test_grpc_peers_and_metadata() -> None:
    access = AdminAccess(None, "127.0.0.1")
    access.check_grpc(_Context("ipv4:127.0.0.1:51234"))
    access.check_grpc(_Context("ipv6:[::1]:51234"))
    for peer in ("ipv4:10.0.0.7:51234", "ipv6:[2001:db8::1]:5", "unix:/tmp/s"):
        with pytest.raises(Forbidden):
            access.check_grpc(_Context(peer))
    with pytest.raises(Forbidden):
        access.check_grpc(_Context("ipv4:127.0.0.1:1", (("x-forwarded-for", "192.0.2.9"),)))
    tokened = AdminAccess(TOKEN, "0.0.0.0")
    tokened.check_grpc(_Context("ipv4:10.0.0.7:1", (("authorization", f"Bearer {TOKEN}"),)))
    with pytest.raises(Unauthenticated):
        tokened.check_grpc(_Context("ipv4:10.0.0.7:1", (("authorization", "Bearer no"),)))


# --- the token's length and the open-host warning ------------------------------------


def test_a_short_environment_token_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "abc")
    with pytest.raises(ConfigError, match="3 characters long; an admin token needs at least 8"):
        admin_token(None)
    with pytest.raises(ConfigError):
        AdminAccess.from_config(ServerConfig())
    assert admin_token("configured-token") == "configured-token"  # the config key wins
    monkeypatch.setenv(TOKEN_ENV, "")
    assert admin_token(None) is None
    monkeypatch.setenv(TOKEN_ENV, "12345678")
    assert admin_token(None) == "12345678"


def test_the_warning_names_what_is_exposed() -> None:
    assert exposure_warning("127.0.0.1", None) is None
    assert exposure_warning("0.0.0.0", TOKEN) is None
    warning = exposure_warning("0.0.0.0", None)
    assert warning is not None
    assert "0.0.0.0" in warning and "no admin token" in warning
    assert "inference" in warning and "403" in warning and TOKEN_ENV in warning


def _start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], env: dict[str, str]
) -> Any:
    """``sordino start ARGS`` up to serving: ``_run`` is replaced, nothing binds a port."""
    monkeypatch.setattr(start_command, "_run", lambda config, sources, failed: 0)
    base = ["start", "--http-port", "0", "--data-dir", str(tmp_path / "data")]
    return CliRunner().invoke(cli, [*base, *args], env=env)


def test_start_warns_on_an_open_host_without_a_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    open_host = ["--host", "0.0.0.0", "--insecure"]  # without auth.required: see below
    with caplog.at_level(logging.WARNING, logger="sordino"):
        result = _start(monkeypatch, tmp_path, open_host, {})
    assert result.exit_code == 0, result.output
    assert any("reachable from other machines" in r.getMessage() for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sordino"):
        result = _start(monkeypatch, tmp_path, open_host, {TOKEN_ENV: TOKEN})
    assert result.exit_code == 0, result.output
    assert not any("reachable" in r.getMessage() for r in caplog.records)


def test_start_refuses_a_short_environment_token(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    result = _start(monkeypatch, tmp_path, [], {TOKEN_ENV: "abc"})
    assert result.exit_code == 2
    assert f"{TOKEN_ENV} is 3 characters long" in result.output


def test_start_refuses_an_open_host_without_auth_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    result = _start(monkeypatch, tmp_path, ["--host", "0.0.0.0"], {})
    assert result.exit_code == 2
    assert "refusing to listen on 0.0.0.0" in result.output
    assert "auth.required" in result.output and "--insecure" in result.output
    assert "Traceback" not in result.output
    config = tmp_path / "auth.yaml"
    config.write_text("auth: {required: true}\n")
    result = _start(monkeypatch, tmp_path, ["--host", "0.0.0.0", "--config", str(config)], {})
    assert result.exit_code == 0, result.output
