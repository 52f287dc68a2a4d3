"""``sordino profile``: profile a served model's operators for a while, print the top ones."""

from __future__ import annotations

import sys

import click
from rich.console import Console
from rich.table import Table

from sordino.cli.client import ServerError, ServerUnreachable, post_json
from sordino.cli.server_url import auth_headers, model_name, server_url, token_option, url_option
from sordino.telemetry.profile_data import OperatorProfile

__all__ = ["apply_advice", "profile", "profile_header", "profile_table"]


def apply_advice(url: str | None, token: str | None, model: str) -> None:
    """Print the findings on ``model``'s figures; apply the live ones through reconfigure."""
    from sordino.cli.reconfigure import change_config, get_json, print_entry
    from sordino.operations.advice import advise

    stats = get_json(url, token, f"/v2/models/{model}/stats")["model_stats"][0]
    live = get_json(url, token, "/v2/sordino/config")
    config = (live.get("models") or {}).get(model, {})
    strategy = (live.get("scheduler") or {}).get("dynamic_batching") or {}
    settings: dict[str, object] = {}
    for finding in advise(model, stats, config, strategy):
        click.echo(f"finding: {finding.title}: {finding.detail}")
        settings.update(finding.settings)
    if not settings:
        click.echo("nothing to apply")
        return
    entry = change_config(url, token, {"set": settings, "source": "profile --apply"}, wait_s=120)
    print_entry(entry)
    if entry["result"] == "rolled_back":
        sys.exit(1)


def profile_header(result: OperatorProfile) -> str:
    """One line saying what was profiled."""
    plural = "es" if result.batches != 1 else ""
    if result.synthetic:
        what = f"{result.batches} zero-filled batch{plural} (no live traffic)"
    else:
        what = f"{result.batches} batch{plural} of live traffic"
    return (
        f"{result.model}/{result.version}: {what} in {result.seconds:g} s, "
        f"{result.total_ms:.1f} ms inside operators"
    )


def profile_table(result: OperatorProfile, top: int) -> Table:
    """The ``top`` operator types of ``result`` as a table."""
    table = Table()
    for name, justify in (("operator", "left"), ("total ms", "right"), ("share", "right"),
                          ("calls", "right"), ("provider", "left")):  # fmt: skip
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for op in result.top(top):
        table.add_row(op.op, f"{op.total_ms:.2f}", f"{op.share:.1%}", str(op.calls), op.provider)
    return table


@click.command()
@url_option
@token_option
@click.option("--model", callback=model_name, required=True, help="The model to profile.")
@click.option("--version", "model_version", default=None, help="Its version (default: latest).")
@click.option(
    "--seconds",
    type=click.FloatRange(0, 300, min_open=True),
    default=10.0,
    show_default=True,
    help="How long to profile (at most 300).",
)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=10,
    show_default=True,
    help="How many operators to print.",
)
@click.option(
    "--apply",
    "apply_findings",
    is_flag=True,
    help="Turn the model's figures into suggestions and apply them through reconfigure.",
)
def profile(
    url: str | None,
    token: str | None,
    model: str,
    model_version: str | None,
    seconds: float,
    top: int,
    apply_findings: bool = False,
) -> None:
    """Profile MODEL's operators with ONNX Runtime's profiler and print the top ones.

    The live traffic of the next SECONDS is profiled (zero-filled batches when none
    arrives); the breakdown is journaled as an ``operator_profile`` event and exported
    as ``sordino_operator_seconds``. Profiling needs the server's admin token (--token,
    else $SORDINO_ADMIN_TOKEN) unless the server runs on loopback without one.
    """
    body = {"model": model, "seconds": seconds}
    if model_version:
        body["version"] = model_version
    click.echo(f"profiling {model} for {seconds:g} s …", err=True)
    try:
        data = post_json(
            server_url(url),
            "/v2/sordino/profile",
            body,
            timeout=seconds + 60,
            headers=auth_headers(token),
        )
    except (ServerUnreachable, ServerError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    result = OperatorProfile.from_json(data)
    click.echo(profile_header(result))
    Console().print(profile_table(result, top))
    for lost in result.lost:
        click.echo(f"not profiled to the end (its trace is lost): {lost}")
    if result.kernel_launches is not None:
        click.echo(f"kernel launches: {result.kernel_launches}")
    click.echo("journaled as an operator_profile event")
    if apply_findings:
        apply_advice(url, token, model)
