"""``sordino chaos``: inject, list and clear faults on a running server (admin API)."""

from __future__ import annotations

import sys
from typing import Any

import click

from sordino.control.admin import TOKEN_ENV
from sordino.control.client import AdminClient, AdminError

__all__ = ["chaos"]


def _describe(fault: dict[str, Any]) -> str:
    parts = [f"{fault['id']}: {fault['kind']} on {fault['target']} at rate {fault['rate']:g}"]
    if fault["kind"] == "latency":
        parts.append(f"+{fault['latency_s'] * 1000:.0f} ms")
    if fault.get("remaining_s") is not None:
        parts.append(f"{fault['remaining_s']:.0f} s left")
    return ", ".join(parts)


@click.group()
@click.option(
    "--url",
    envvar="SORDINO_URL",
    default="http://127.0.0.1:8000",
    show_default=True,
    help="The server (env SORDINO_URL).",
)
@click.option("--token", envvar=TOKEN_ENV, help=f"Admin token (env {TOKEN_ENV}).")
@click.pass_context
def chaos(ctx: click.Context, url: str, token: str | None) -> None:
    """Inject faults into a running server's workers and devices."""
    ctx.obj = AdminClient(url, token)


def _run(call: Any) -> Any:
    try:
        return call()
    except AdminError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


@chaos.command()
@click.option(
    "--target",
    required=True,
    metavar="device:NAME|worker:MODEL[/N]",
    help="A device, all instances of a model, or its N-th instance.",
)
@click.option(
    "--fault", required=True, type=click.Choice(["error", "latency", "crash", "hang", "oom"])
)
@click.option("--rate", type=float, default=1.0, show_default=True, help="Share of batches hit.")
@click.option("--latency", default="200ms", show_default=True, help="Added delay (latency).")
@click.option("--duration", default=None, help="Clear by itself after this long (e.g. 30s).")
@click.pass_obj
def inject(
    client: AdminClient, target: str, fault: str, rate: float, latency: str, duration: str | None
) -> None:
    """Inject a fault; it acts inside the worker processes it targets."""
    spec = _run(lambda: client.inject(target, fault, rate=rate, latency=latency, duration=duration))
    click.echo(f"injected {_describe(spec)}")


@chaos.command(name="list")
@click.pass_obj
def list_faults(client: AdminClient) -> None:
    """List the active faults."""
    faults = _run(client.faults)
    if not faults:
        click.echo("no active faults")
    for fault in faults:
        click.echo(_describe(fault))


@chaos.command()
@click.option("--id", "fault_id", default=None, help="Clear only this fault.")
@click.pass_obj
def clear(client: AdminClient, fault_id: str | None) -> None:
    """Clear one fault, or all of them."""
    removed = _run(lambda: client.clear(fault_id))
    click.echo(f"cleared {len(removed)} fault(s)")
