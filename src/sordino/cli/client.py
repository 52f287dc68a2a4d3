"""A small JSON client for the CLI's talks with a running server (stdlib only).

Every failure becomes :class:`ServerUnreachable` or :class:`ServerError` with a
message a person can act on; the commands print it, never a traceback.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

__all__ = ["ServerError", "ServerUnreachable", "get_json", "post_json"]


class ServerUnreachable(Exception):
    """No server answered at the URL."""


class ServerError(Exception):
    """The server answered with an error status; the message is its ``error`` field."""


def _request(request: urllib.request.Request, timeout: float) -> Any:
    url = request.full_url
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read()).get("error", exc.reason)
        except (ValueError, AttributeError):
            message = exc.reason
        raise ServerError(f"{url} answered {exc.code}: {message}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason.strerror if isinstance(exc.reason, OSError) else exc.reason
        raise ServerUnreachable(f"cannot reach {url}: {reason or exc.reason}") from None
    except TimeoutError:
        raise ServerUnreachable(f"{url} did not answer within {timeout:g} s") from None
    except (ConnectionError, OSError) as exc:
        raise ServerUnreachable(f"cannot reach {url}: {exc}") from None
    except ValueError as exc:
        raise ServerError(f"{url} did not answer JSON: {exc}") from None


def get_json(base: str, path: str, *, timeout: float = 5.0) -> Any:
    """GET ``base + path`` and return the decoded JSON."""
    return _request(urllib.request.Request(base.rstrip("/") + path), timeout)


def post_json(base: str, path: str, body: Any, *, timeout: float = 5.0) -> Any:
    """POST ``body`` as JSON to ``base + path`` and return the decoded JSON answer."""
    request = urllib.request.Request(
        base.rstrip("/") + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    return _request(request, timeout)
