"""An http(s) address given by a user (``--url``, a webhook alert channel), checked the
same way wherever one is taken."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["http_url_problem"]


def http_url_problem(url: str) -> str | None:
    """What is wrong with ``url`` as an http(s) address with a host (and a valid port),
    or None when nothing is."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises ValueError for a port that is not a number)
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "it must start with http:// or https://"
    if not parts.hostname:
        return "it names no host"
    return None
