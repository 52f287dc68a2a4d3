"""``sordino chaos``: inject, list and clear faults on a running server (admin API)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from sordino.cli.group import Group
from sordino.cli.server_url import admin_client, admin_options, or_exit

__all__ = ["chaos"]


def _describe(fault: dict[str, Any]) -> str:
    parts = [f"{fault['id']}: {fault['kind']} on {fault['target']} at rate {fault['rate']:g}"]
    if fault["kind"] == "latency":
        parts.append(f"+{fault['latency_s'] * 1000:.0f} ms")
    if fault.get("celsius") is not None:
        parts.append(f"reads {fault['celsius']:g} °C")
    if fault.get("tenant") is not None:
        parts.append(f"only tenant {fault['tenant']}")
    if fault.get("remaining_s") is not None:
        parts.append(f"{fault['remaining_s']:.0f} s left")
    return ", ".join(parts)


F = TypeVar("F", bound=Callable[..., Any])


@click.group(cls=Group)
@admin_options
@click.pass_context
def chaos(ctx: click.Context, url: str | None, token: str | None) -> None:
    """Inject faults into a running server's workers and devices."""
    ctx.obj = {"url": url, "token": token}


@chaos.command()
@click.option(
    "--target",
    required=True,
    metavar="device:NAME|worker:MODEL[/N]",
    help="A device, all instances of a model, or its N-th instance.",
)
@click.option(
    "--fault",
    required=True,
    type=click.Choice(["error", "latency", "crash", "hang", "oom", "temperature"]),
)
@click.option("--rate", type=float, default=1.0, show_default=True, help="Share of batches hit.")
@click.option("--latency", default="200ms", show_default=True, help="Added delay (latency).")
@click.option("--duration", default=None, help="Clear by itself after this long (e.g. 30s).")
@click.option(
    "--celsius", type=float, default=None, help="The reading a temperature fault reports."
)
@click.option("--tenant", default=None, help="Hit only batches holding this tenant's requests.")
@admin_options
@click.pass_context
def inject(
    ctx: click.Context,
    target: str,
    fault: str,
    rate: float,
    latency: str,
    duration: str | None,
    celsius: float | None,
    tenant: str | None,
    url: str | None,
    token: str | None,
) -> None:
    """Inject a fault; it acts inside the worker processes it targets.

    A temperature fault (``--fault temperature --target device:cpu --celsius 85``)
    overrides the device temperature sensor instead.
    """
    client = admin_client(ctx, url, token)
    spec = or_exit(
        lambda: client.inject(
            target,
            fault,
            rate=rate,
            latency=latency,
            duration=duration,
            celsius=celsius,
            tenant=tenant,
        )
    )
    click.echo(f"injected {_describe(spec)}")


@chaos.command(name="list")
@admin_options
@click.pass_context
def list_faults(ctx: click.Context, url: str | None, token: str | None) -> None:
    """List the active faults."""
    client = admin_client(ctx, url, token)
    faults = or_exit(client.faults)
    if not faults:
        click.echo("no active faults")
    for fault in faults:
        click.echo(_describe(fault))


@chaos.command()
@click.option("--id", "fault_id", default=None, help="Clear only this fault.")
@admin_options
@click.pass_context
def clear(ctx: click.Context, fault_id: str | None, url: str | None, token: str | None) -> None:
    """Clear one fault, or all of them."""
    client = admin_client(ctx, url, token)
    removed = or_exit(lambda: client.clear(fault_id))
    click.echo(f"cleared {len(removed)} fault(s)")
