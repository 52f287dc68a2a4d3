"""A small JSON client for talking to a running server (standard library only).

The CLI commands (``models``, ``monitor``, ``profile``, ``diagnose``, ``chaos``) use
it. Every failure becomes :class:`ServerUnreachable` or :class:`ServerError` with a
message a person can act on; the commands print it, never a traceback.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

__all__ = [
    "TOKEN_ENV",
    "AdminClient",
    "AdminError",
    "ClientError",
    "ServerError",
    "ServerUnreachable",
    "request_json",
]

# The environment variable holding the admin token, on both sides (sordino.control.admin).
TOKEN_ENV = "SORDINO_ADMIN_TOKEN"


class ClientError(Exception):
    """A call to the server did not succeed."""


class ServerUnreachable(ClientError):
    """No server answered at the URL."""


class ServerError(ClientError):
    """The server answered with an error status; the message is its ``error`` field."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status (None: the answer was not the JSON asked for)."""

    @property
    def lasting(self) -> bool:
        """A refusal asking again does not change (a 4xx other than 408 and 429)."""
        return (
            self.status is not None and 400 <= self.status < 500 and self.status not in (408, 429)
        )


AdminError = ClientError
"""What :class:`AdminClient` raises: an unreachable server or an error answer."""


def request_json(
    method: str,
    url: str,
    body: Any = None,
    *,
    headers: dict[str, str] | None = None,
    timeout: float = 5.0,
) -> Any:
    """Send ``body`` (JSON, if any) with ``method`` to ``url``; return the decoded answer."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except (ValueError, AttributeError):
            message = exc.reason
        raise ServerError(f"{url} answered {exc.code}: {message}", exc.code) from None
    except urllib.error.URLError as exc:
        reason = exc.reason.strerror if isinstance(exc.reason, OSError) else exc.reason
        raise ServerUnreachable(f"cannot reach {url}: {reason or exc.reason}") from None
    except TimeoutError:
        raise ServerUnreachable(f"{url} did not answer within {timeout:g} s") from None
    except (ConnectionError, OSError) as exc:
        raise ServerUnreachable(f"cannot reach {url}: {exc}") from None
    except ValueError as exc:
        raise ServerError(f"{url} did not answer JSON: {exc}") from None


class AdminClient:
    """Calls ``/v2/admin/...`` on ``url`` with a bearer ``token``."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return request_json(method, self.url + path, body, headers=headers, timeout=self.timeout_s)

    def inject(self, target: str, fault: str, **options: Any) -> dict[str, Any]:
        body = {"target": target, "fault": fault}
        body.update({k: v for k, v in options.items() if v is not None})
        result: dict[str, Any] = self.request("POST", "/v2/admin/chaos", body)["fault"]
        return result

    def faults(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.request("GET", "/v2/admin/chaos")["faults"]
        return result

    def clear(self, fault_id: str | None = None) -> list[dict[str, Any]]:
        path = "/v2/admin/chaos" + (f"?id={fault_id}" if fault_id else "")
        result: list[dict[str, Any]] = self.request("DELETE", path)["cleared"]
        return result
