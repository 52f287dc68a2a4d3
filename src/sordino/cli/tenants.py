"""``sordino tenants``: list, add and change tenants and their API keys on a running server.

A thin shell over the tenants admin API (``server/tenant_routes.py``); every change is
effective at once, without a restart, and journaled. ``add-key`` prints the new key
once: the server keeps only its hash.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from sordino.cli.group import Group
from sordino.cli.server_url import admin_client, admin_options, or_exit

__all__ = ["describe_tenant", "tenants"]

F = TypeVar("F", bound=Callable[..., Any])


@click.group(cls=Group)
@admin_options
@click.pass_context
def tenants(ctx: click.Context, url: str | None, token: str | None) -> None:
    """Tenants: API keys, weights, rates and limits, changed without a restart."""
    ctx.obj = {"url": url, "token": token}


def _or_none(value: object) -> str:
    return "-" if value is None else str(value)


def describe_tenant(t: dict[str, Any]) -> str:
    """One line per tenant: its settings, keys and what its limits refused."""
    rate = "-" if t["rate"] is None else f"{t['rate']:g}/s (burst {t['burst']:g})"
    keys = ", ".join(t["keys"]) or "none"
    return (
        f"{t['name']}: weight {t['weight']}, rate {rate}, max_concurrency "
        f"{_or_none(t['max_concurrency'])}, max_priority {_or_none(t['max_priority'])}, "
        f"memory_quota {_or_none(t['memory_quota'])}; keys {keys}; {t['in_flight']} in flight, "
        f"{t['requests']} admitted, refused {t['refused_rate']} by rate, "
        f"{t['refused_concurrency']} by concurrency, {t['refused_breaker']} by the breaker "
        f"(breaker {t['breaker']}, {t['breaker_trips']} trips"
        + (
            f"; opens after {t['breaker_failures']} failures for {t['breaker_cooldown']:g} s)"
            if "breaker_failures" in t
            else ")"
        )
    )


def _settings(**options: Any) -> dict[str, Any]:
    """The body of an add or set: the options given (``None``: not given), the breaker's
    two under ``breaker``."""
    breaker = {
        key: options.pop(f"breaker_{key}")
        for key in ("failures", "cooldown")
        if options.get(f"breaker_{key}") is not None
    }
    settings: dict[str, Any] = {key: value for key, value in options.items() if value is not None}
    if breaker:
        # The server fills what is left out from the tenant's breaker (or auth.breaker).
        settings["breaker"] = breaker
    return settings


def _setting_options(command: F) -> F:
    for option in (
        click.option(
            "--breaker-cooldown", default=None, help="How long an open breaker lasts, e.g. 30s."
        ),
        click.option(
            "--breaker-failures",
            type=click.IntRange(min=1),
            default=None,
            help="Failures in a row that open the breaker.",
        ),
        click.option("--max-priority", default=None, help="high, normal, low or a level."),
        click.option("--max-concurrency", type=click.IntRange(min=1), default=None),
        click.option("--burst", type=click.IntRange(min=1), default=None, help="Bucket size."),
        click.option("--rate", default=None, help="Requests per unit of time, e.g. 800/s."),
        click.option("--weight", type=click.IntRange(min=1), default=None),
    ):
        command = option(command)
    return command


@tenants.command("list")
@admin_options
@click.pass_context
def list_tenants(ctx: click.Context, url: str | None, token: str | None) -> None:
    """Every tenant, its settings and counters."""
    document = or_exit(lambda: admin_client(ctx, url, token).request("GET", "/v2/admin/tenants"))
    click.echo(f"auth required: {'yes' if document['auth_required'] else 'no'}")
    if not document["tenants"]:
        click.echo("no tenants")
    for tenant in document["tenants"]:
        click.echo(describe_tenant(tenant))


@tenants.command()
@click.argument("name")
@_setting_options
@admin_options
@click.pass_context
def add(
    ctx: click.Context, /, name: str, url: str | None, token: str | None, **options: Any
) -> None:
    """Add tenant NAME (then give it a key with add-key)."""
    body = {"name": name, **_settings(**options)}
    document = or_exit(
        lambda: admin_client(ctx, url, token).request("POST", "/v2/admin/tenants", body)
    )
    click.echo(describe_tenant(document))


@tenants.command("set")
@click.argument("name")
@_setting_options
@admin_options
@click.pass_context
def set_tenant(
    ctx: click.Context, /, name: str, url: str | None, token: str | None, **options: Any
) -> None:
    """Change tenant NAME's weight, rate, burst, concurrency, priority cap or breaker."""
    body = _settings(**options)
    if not body:
        raise click.UsageError(
            "nothing to set: give at least one of --weight, --rate, --burst, "
            "--max-concurrency, --max-priority, --breaker-failures, --breaker-cooldown"
        )
    path = f"/v2/admin/tenants/{name}"
    document = or_exit(lambda: admin_client(ctx, url, token).request("PATCH", path, body))
    click.echo(describe_tenant(document))


@tenants.command("add-key")
@click.argument("name")
@admin_options
@click.pass_context
def add_key(ctx: click.Context, name: str, url: str | None, token: str | None) -> None:
    """Make a new API key for NAME and print it once (the server keeps only its hash)."""
    path = f"/v2/admin/tenants/{name}/keys"
    document = or_exit(lambda: admin_client(ctx, url, token).request("POST", path))
    click.echo(document["key"])
    click.echo(
        f"(key id {document['id']}; shown once, the server stores only its hash; "
        f"revoke with: sordino tenants revoke-key {name} {document['id']})",
        err=True,
    )


@tenants.command("revoke-key")
@click.argument("name")
@click.argument("key_id")
@admin_options
@click.pass_context
def revoke_key(
    ctx: click.Context, name: str, key_id: str, url: str | None, token: str | None
) -> None:
    """Revoke NAME's key KEY_ID (as `list` shows it); effective at once."""
    path = f"/v2/admin/tenants/{name}/keys/{key_id}"
    document = or_exit(lambda: admin_client(ctx, url, token).request("DELETE", path))
    click.echo(f"revoked key {document['revoked']} of tenant {name}")
