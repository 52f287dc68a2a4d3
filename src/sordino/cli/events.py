"""``sordino events`` and ``sordino guardian status``: what the server did, and why.

``events`` lists the server's events (the guardian's diagnostic records among them,
``--kind guardian``) from the last ``--since``; ``--follow`` keeps printing new ones
until Ctrl-C. ``guardian status`` shows each trigger's metric now against its
threshold, its cooldown and next action, the hourly budget and the admission gate.
"""

from __future__ import annotations

import sys
import time
from datetime import datetime
from typing import Any

import click

from sordino.cli.group import Group
from sordino.cli.server_url import auth_headers, server_url, token_option, url_option
from sordino.control.client import ClientError, request_json
from sordino.errors import ConfigError

__all__ = ["events", "guardian"]


def _get(url: str, path: str, token: str | None) -> Any:
    try:
        return request_json("GET", url.rstrip("/") + path, headers=auth_headers(token))
    except ClientError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


def _line(event: dict[str, Any]) -> str:
    stamp = datetime.fromtimestamp(event["t"]).strftime("%Y-%m-%d %H:%M:%S")
    text = f"{stamp}  {event['kind']:<18} {event['subject']}"
    payload = event.get("payload") or {}
    if event["kind"] == "guardian":
        flags = f" [{payload.get('verify')}{', rolled back' if payload.get('rolled_back') else ''}]"
        action = f": {payload.get('action')}" if payload.get("action") else ""
        return f"{text}{action}{flags}\n    {payload.get('explanation') or event['cause']}"
    return f"{text}: {event['cause']}" if event["cause"] else text


@click.command()
@click.option("--since", default="1h", show_default=True, help="How far back (e.g. 30m, 2h).")
@click.option("--kind", default=None, help="Only events of this kind (e.g. guardian).")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events until Ctrl-C.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@url_option
@token_option
def events(
    since: str, kind: str | None, follow: bool, as_json: bool, url: str | None, token: str | None
) -> None:
    """List the server's events: guardian actions, worker restarts, faults, switches."""
    import json

    from sordino.config.units import parse_duration

    try:
        seconds = parse_duration(since)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from None
    base = server_url(url)
    query = f"?since={seconds:g}" + (f"&kind={kind}" if kind else "")
    last = 0.0
    try:
        while True:
            found = _get(base, "/v2/sordino/events" + query, token)["events"]
            for event in found:
                if event["t"] <= last:
                    continue
                click.echo(json.dumps(event) if as_json else _line(event))
                last = event["t"]
            if not follow:
                if not found and not as_json:
                    click.echo(f"no {kind + ' ' if kind else ''}events in the last {since}")
                return
            time.sleep(1.0)
            query = f"?after={last}" + (f"&kind={kind}" if kind else "")
    except KeyboardInterrupt:
        return


@click.group(cls=Group)
def guardian() -> None:
    """The guardian (self-healing): its triggers and what it is doing."""


@guardian.command()
@url_option
@token_option
def status(url: str | None, token: str | None) -> None:
    """Each trigger's value against its threshold, cooldowns, the budget, the gate."""
    data = _get(server_url(url), "/v2/sordino/guardian", token)
    gate = data.get("gate", {})
    if not data.get("enabled"):
        click.echo(
            "the guardian is off: self_healing lists no triggers or says enabled: false "
            "(start the server with --guardian-mode true to run it)"
        )
    else:
        click.echo(
            f"guardian on, every {data['interval_s']:g} s; budget "
            f"{data['actions_last_hour']}/{data['budget_per_hour']} actions this hour; "
            f"{data['records']} records"
        )
        for t in data["triggers"]:
            state = "HOLDS" if t["holds"] else "ok"
            click.echo(
                f"  {t['metric']}{' of ' + t['model'] if t['model'] else ''}: "
                f"{t['value_text']} vs {t['threshold']} over {t['window_s']:g} s [{state}]"
            )
            detail = f"    next: {t['next_action']}; fired {t['fired']}x"
            if t["cooldown_left_s"] > 0:
                detail += f"; cooldown {t['cooldown_left_s']:.1f} s left"
            if t["active"]:
                detail += f"; active: {', '.join(t['active'])}"
            click.echo(detail)
        if data.get("alert_channels"):
            click.echo(
                f"  alerts: {', '.join(data['alert_channels'])} "
                f"({data['alerts_sent']} sent, {data['alerts_failed']} failed)"
            )
    throttled = gate.get("throttled") or {}
    if throttled or gate.get("shedding") or gate.get("skipping"):
        parts = [f"throttle {m} {s:.0%}" for m, s in throttled.items()]
        parts += [f"shedding low priority of {m}" for m in gate.get("shedding", ())]
        parts += [f"skipping non-critical of {m}" for m in gate.get("skipping", ())]
        click.echo("  admission: " + "; ".join(parts))
