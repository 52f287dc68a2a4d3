"""``sordino memory``: the shared-memory arena of a running server (status, defrag, resize)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from sordino.cli.group import Group
from sordino.cli.server_url import admin_client, admin_options, or_exit

__all__ = ["memory"]

F = TypeVar("F", bound=Callable[..., Any])


def _mib(nbytes: int | None) -> str:
    return "-" if nbytes is None else f"{nbytes / 2**20:.1f} MiB"


@click.group(cls=Group)
@admin_options
@click.pass_context
def memory(ctx: click.Context, url: str | None, token: str | None) -> None:
    """The shared-memory arena: pools, tiers, fragmentation, owners, defragmentation."""
    ctx.obj = {"url": url, "token": token}


def describe_status(status: dict[str, Any]) -> list[str]:
    """The lines ``sordino memory status`` prints for a ``/v2/sordino/memory`` document."""
    lines = [f"strategy {status['strategy']}"]
    arena = status.get("arena")
    # The Ray executor's node pools, when there are some, hold the bytes and the quotas.
    on_nodes = bool(status.get("nodes")) and arena is None
    if on_nodes:
        lines.append("arena: not used (the Ray nodes have their own pools, below)")
    elif arena is None:
        lines.append("arena: not created yet (no model runs in a worker process)")
    else:
        lines.append(
            f"arena {arena['name']}: {_mib(arena['in_use_bytes'])} in use of "
            f"{_mib(arena['reserved_bytes'])} (peak {_mib(arena['peak_bytes'])}), largest free "
            f"{_mib(arena['largest_free'])}, fragmentation {arena['fragmentation']:.1%}, "
            f"{arena['waiting']} waiting"
        )
    for tier in status.get("tiers", []):
        if tier["reserved_bytes"] or tier["in_use_bytes"]:
            lines.append(
                f"  tier {tier['tier']}/{tier['lifetime']}: {_mib(tier['in_use_bytes'])} in use "
                f"of {_mib(tier['reserved_bytes'])} in {tier['chunks']} chunks, "
                f"fragmentation {tier['fragmentation']:.1%}"
            )
    for owner in [] if on_nodes else status.get("owners", []):
        quota = owner["quota_bytes"]
        lines.append(
            f"owner {owner['owner']}: {_mib(owner['in_use_bytes'])} in flight (peak "
            f"{_mib(owner['peak_bytes'])}), quota {_mib(quota) if quota else 'none'}, "
            f"{owner['waits']} waits, {owner['rejections']} refused"
        )
    for pool in status.get("pools", []):
        lines.append(
            f"node pool of model {pool['owner']}: {_mib(pool['in_use_bytes'])} in flight "
            f"(peak {_mib(pool['peak_bytes'])}) of {_mib(pool['quota_bytes'] or 0)}, "
            f"{pool['waits']} waits, {pool['rejections']} refused"
        )
    lines.append(
        f"overflow: {status['overflow_shrinks']} batches shrunk, {status['overflow_waits']} "
        f"waited, {status['overflow_rejections']} answered 503, "
        f"{status['oversized_rejections']} larger than the arena"
    )
    lines.append(
        f"defrag: {status['defrag_runs']} runs, {_mib(status['defrag_bytes_moved'])} moved, "
        f"{status['defrag_pause_s'] * 1000:.1f} ms paused in all"
    )
    compaction = status.get("compaction")
    if compaction and compaction["budget_bytes"]:
        lines.append(
            f"compaction steps (<= {_mib(compaction['budget_bytes'])} per batch): "
            f"{compaction['steps']} boundaries, {compaction['steps_moving']} moved "
            f"{_mib(compaction['bytes_moved'])} in {compaction['blocks_moved']} blocks; "
            f"pause {compaction['pause_s'] * 1000:.1f} ms in all, "
            f"{compaction['max_pause_s'] * 1000:.2f} ms at most"
        )
    arena_peak = arena["peak_bytes"] if arena is not None else None
    for forecast in status.get("forecasts", []):
        predicted = forecast["predicted_peak_bytes"]
        qps = forecast["forecast_peak_qps"]
        prediction = (
            f"forecast peak {qps:.1f} req/s -> {_mib(int(predicted))} in flight"
            if predicted is not None
            else "no forecast yet (it needs the journal's history)"
        )
        lines.append(
            f"model {forecast['model']}: {forecast['bytes_per_request'] / 1024:.1f} KiB and "
            f"{forecast['seconds_per_request'] * 1000:.1f} ms per request; {prediction}; "
            f"arena peak so far {_mib(arena_peak)}"
        )
    pool = status.get("pool")
    if pool is not None:
        lines.extend(describe_pool(pool))
    for worker in status.get("workers", []):
        lines.append(
            f"worker {worker['model']}:{worker['version']}#{worker['instance']} pid "
            f"{worker['pid']}: {_mib(worker['rss_bytes'])} resident (ONNX Runtime does not "
            f"expose its arena's size); CPU arena {worker['cpu_arena']}; GPU {worker['gpu']}"
            + (f" ({_mib(worker['gpu_bytes'])} on the GPU)" if worker.get("gpu_bytes") else "")
        )
    lines.extend(describe_nodes(status.get("nodes", [])))
    for plan in status.get("plans", []):
        lines.append(
            f"plan {plan['model']}: {plan['requests']} requests; last {plan['steps']} steps in "
            f"{_mib(plan['planned_peak_bytes'])} planned vs {_mib(plan['naive_bytes'])} naive; "
            f"largest {_mib(plan['max_planned_peak_bytes'])}"
            + (
                f"; outputs in one region of {plan['region_bytes']} bytes, "
                f"{plan['region_peak_bytes']} used at most, {plan['region_fallbacks']} fallbacks"
                if plan.get("regions")
                else ""
            )
        )
    return lines


def _size(nbytes: int) -> str:
    """Bytes in KiB below one MiB (a node pool's batches are often that small), else MiB."""
    return f"{nbytes / 1024:.1f} KiB" if nbytes < 2**20 else _mib(nbytes)


def describe_nodes(nodes: list[dict[str, Any]]) -> list[str]:
    """The Ray nodes' pools as a table: one row per node, then its owners with a quota
    or bytes in flight (executor.kind: ray)."""
    if not nodes:
        return []
    header = ("node", "address", "in use", "reserved", "peak", "largest free", "frag", "quota use")
    rows = [header]
    for node in nodes:
        arena = node["arena"]
        limited = [o for o in node["owners"] if o["quota_bytes"]]
        quota = ", ".join(
            f"{o['owner']} {_size(o['in_use_bytes'])}/{_size(o['quota_bytes'])}" for o in limited
        )
        rows.append(
            (
                node["node"][:12],
                node["address"],
                _size(arena["in_use_bytes"]),
                _size(arena["reserved_bytes"]),
                _size(arena["peak_bytes"]),
                _size(arena["largest_free"]),
                f"{arena['fragmentation']:.1%}",
                quota or "no quotas",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["ray node pools:"]
    lines += ["  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
              for row in rows]  # fmt: skip
    for node in nodes:
        for owner in node["owners"]:
            if owner["waits"] or owner["rejections"]:
                lines.append(
                    f"  node {node['node'][:12]} owner {owner['owner']}: {owner['waits']} "
                    f"waits, {owner['rejections']} refused by its per-node quota"
                )
        if node["overflow_waits"] or node["overflow_rejections"]:
            lines.append(
                f"  node {node['node'][:12]}: {node['overflow_waits']} batches waited for "
                f"space, {node['overflow_rejections']} answered 503"
            )
    return lines


def describe_pool(pool: dict[str, Any]) -> list[str]:
    """The pool's lines: its size, and for pool_size auto the prediction next to reality."""
    last = pool["last_resize"]
    resized = (
        f"last {_mib(last['bytes_before'])} -> {_mib(last['bytes_after'])} ({last['reason']}, "
        f"{last['pause_s'] * 1000:.1f} ms pause)"
        if last is not None
        else "none yet"
    )
    if not pool["auto"]:
        return [
            f"pool: {_mib(pool['capacity_bytes'])} fixed; resizes: {pool['resizes']}, {resized}"
        ]
    predicted = pool["predicted_peak_bytes"]
    return [
        f"pool auto: {_mib(pool['capacity_bytes'])} (bounds {_mib(pool['min_bytes'])}.."
        f"{_mib(pool['max_bytes'])}), target {_mib(pool['target_bytes'])}",
        f"  predicted peak {_mib(int(predicted)) if predicted is not None else '- (no forecast)'}"
        f" vs real peak {_mib(pool['observed_peak_bytes'])}; {pool['resizes']} resizes "
        f"({pool['deferred']} deferred), {resized}",
    ]


def describe_defrag(report: dict[str, Any]) -> str:
    return (
        f"moved {report['bytes_moved']} bytes in {report['blocks_moved']} blocks over "
        f"{report.get('duration_s', report['pause_s']) * 1000:.2f} ms in "
        f"{report.get('steps', 1)} steps (longest pause {report['pause_s'] * 1000:.2f} ms); "
        f"fragmentation {report['fragmentation_before']:.1%}"
        f" -> {report['fragmentation_after']:.1%} ({report['pinned_blocks']} blocks pinned by "
        "running batches or responses)"
    )


@memory.command()
@admin_options
@click.pass_context
def status(ctx: click.Context, url: str | None, token: str | None) -> None:
    """Show the arena, its tiers, owners and quotas, overflow and defrag figures."""
    client = admin_client(ctx, url, token)
    document = or_exit(lambda: client.request("GET", "/v2/sordino/memory"))
    for line in describe_status(document):
        click.echo(line)


@memory.command()
@admin_options
@click.pass_context
def defrag(ctx: click.Context, url: str | None, token: str | None) -> None:
    """Defragment the arena now; report bytes moved and the pause it caused."""
    client = admin_client(ctx, url, token)
    report = or_exit(lambda: client.request("POST", "/v2/sordino/memory/defrag"))
    click.echo(describe_defrag(report))


@memory.command(short_help="Replace the arena by one of SIZE at the next quiet moment.")
@click.argument("size")
@admin_options
@click.pass_context
def resize(ctx: click.Context, size: str, url: str | None, token: str | None) -> None:
    """Replace the arena by one of SIZE (e.g. 256MB) at the next quiet moment."""
    client = admin_client(ctx, url, token)
    report = or_exit(lambda: client.request("POST", "/v2/sordino/memory/resize", {"size": size}))
    if not report.get("resized"):
        click.echo(f"not resized: {report.get('why')}")
        return
    click.echo(
        f"arena {_mib(report['bytes_before'])} -> {_mib(report['bytes_after'])}: copied "
        f"{report['bytes_copied']} bytes in {report['blocks_copied']} blocks, "
        f"{report['pause_s'] * 1000:.1f} ms pause"
    )
