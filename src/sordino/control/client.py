"""A small client for the admin API (standard library only, for the CLI)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

__all__ = ["AdminClient", "AdminError"]


class AdminError(Exception):
    """The admin API answered with an error (or could not be reached)."""


class AdminClient:
    """Calls ``/v2/admin/...`` on ``url`` with a bearer ``token``."""

    def __init__(self, url: str, token: str | None, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as exc:
            try:
                message = json.loads(exc.read()).get("error", exc.reason)
            except (ValueError, AttributeError):
                message = exc.reason
            raise AdminError(f"{exc.code}: {message}") from None
        except urllib.error.URLError as exc:
            raise AdminError(f"cannot reach {self.url}: {exc.reason}") from None

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
