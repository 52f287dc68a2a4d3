"""``sordino tune``: the tuning advisor against a running server (loadtest/tune.py)."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any, NoReturn

import click

from sordino.cli.reconfigure import change_config, get_json
from sordino.cli.server_url import model_name, server_url, token_option, url_option
from sordino.errors import ConfigError

if TYPE_CHECKING:
    from sordino.loadtest.tune import Candidate, Point

__all__ = ["tune"]


def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _numbers(text: str, what: str, kind: type = int) -> list[Any]:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        _fail(f"{what} {text!r} is not a comma-separated list of numbers", 2)
    if not values or any(v < 0 for v in values):
        _fail(f"{what} {text!r}: give one or more non-negative numbers", 2)
    return values


def _within_limit(model: str, grid: list[Candidate], limit: int | None) -> list[Candidate]:
    """The candidates whose batch the model can take: at least 1 row, and at most its
    ``max_batch_size`` (the rows a request may carry, which tune leaves alone)."""
    if limit == 0:
        _fail(f"model {model!r} does not batch (max_batch_size 0): there is no batch to tune")
    if any(c.max_batch < 1 for c in grid):
        _fail("--max-batch: a batch holds at least 1 row", 2)
    kept = [c for c in grid if limit is None or c.max_batch <= limit]
    skipped = sorted({c.max_batch for c in grid} - {c.max_batch for c in kept})
    if skipped:
        sizes = ", ".join(map(str, skipped))
        click.echo(f"skipping max_batch {sizes}: above {model}'s max_batch_size {limit}")
    if not kept:
        _fail(f"every --max-batch is above {model}'s max_batch_size {limit}", 2)
    return kept


def _row(point: Point) -> str:
    name = point.candidate.label() if point.candidate else "live settings (baseline)"
    p99 = f"{point.p99_ms:.1f} ms" if point.p99_ms is not None else "-"
    return f"  {name:<48} {point.throughput:>8.1f} req/s  p99 {p99}"


@click.command(short_help="Sweep a model's live settings; print the Pareto front and a config.")
@click.option("--model", callback=model_name, required=True, help="The served model to tune.")
@click.option("--objective", default="max throughput with p99<50ms", show_default=True,
              help="'max throughput with p99<Nms', 'max throughput' or 'min p99'.")  # fmt: skip
@click.option("--max-batch", "max_batch", default="1,8,32", show_default=True)
@click.option("--delay-us", "delays", default="0,2000", show_default=True,
              help="Batching delays (max_queue_delay_microseconds) to try.")  # fmt: skip
@click.option("--modes", default="manual,adaptive", show_default=True)
@click.option("--rates", default="200,400,800,1600", show_default=True,
              help="The open-loop rate ladder (requests/s), lowest first.")  # fmt: skip
@click.option("--seconds", default=3.0, show_default=True, help="Length of each run.")
@click.option("--refine", default=3, show_default=True, type=click.IntRange(0, 10),
              help="Bisection steps between ladder rungs for the live settings and the "
                   "recommendation, run side by side (throughput objectives; 0: none).",
              )  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print every point as JSON.")
@url_option
@token_option
def tune(
    model: str, objective: str, max_batch: str, delays: str, modes: str, rates: str,
    seconds: float, refine: int, as_json: bool, url: str | None, token: str | None,
) -> None:  # fmt: skip
    """Try batch sizes, delays and modes with short open-loop runs; recommend one.

    Only what changes live is swept (instance count and intra-op threads need a model
    reload). The live settings are restored at the end; apply the recommendation with
    `sordino reconfigure --file`.
    """
    # Imported here, so that the other commands start without numpy, aiohttp and hdrh.
    from sordino.loadtest import tune as advisor
    from sordino.loadtest.run import Unreachable

    try:
        goal = advisor.parse_objective(objective)
    except ConfigError as exc:
        _fail(str(exc), 2)
    mode_list = [m.strip() for m in modes.split(",") if m.strip()]
    grid = advisor.candidates(
        _numbers(max_batch, "--max-batch"), _numbers(delays, "--delay-us"), mode_list
    )
    ladder = _numbers(rates, "--rates", float)
    if seconds <= 0:
        _fail("--seconds must be positive", 2)
    live = get_json(url, token, "/v2/sordino/config")
    config = (live.get("models") or {}).get(model)
    if config is None:
        _fail(
            f"no model {model!r} is served (served: {', '.join(sorted(live.get('models') or {}))})"
        )
    grid = _within_limit(model, grid, config.get("max_batch_size"))
    restore = advisor.live_settings(model, config)

    def apply(settings: dict[str, Any]) -> None:
        body = {"set": settings, "verify_window": 0, "source": "tune"}
        change_config(url, token, body, wait_s=30)

    click.echo(f"tuning {model}: {len(grid)} candidates × {len(ladder)} rates × {seconds:g} s "
               f"for '{goal}'")  # fmt: skip
    try:
        baseline, points = advisor.sweep(
            server_url(url).rstrip("/"), model, grid, rates=ladder, seconds=seconds,
            objective=goal, apply=apply, restore=restore,
            progress=lambda point: click.echo(_row(point)),
        )  # fmt: skip
    except Unreachable as exc:
        _fail(str(exc))
    front = advisor.pareto(points)
    best = advisor.recommend(points, goal)
    refined: list[Point] = []
    same = (
        best is not None
        and best.candidate is not None
        and (best.candidate.settings(model) == restore)
    )
    if same:
        click.echo("the live settings are already the recommendation")
    elif refine and goal.goal == "throughput" and best is not None and best.candidate is not None:
        click.echo(f"side by side, {refine} bisection steps each between the ladder's rungs:")
        try:
            refined = advisor.refine(
                server_url(url).rstrip("/"), model,
                [(restore, baseline), (best.candidate.settings(model), best)],
                steps=refine, seconds=seconds, objective=goal, apply=apply, restore=restore,
            )  # fmt: skip
        except Unreachable as exc:
            _fail(str(exc))
        baseline, best = refined
        for point in refined:
            click.echo(_row(point))
    if as_json:
        report = {
            "baseline": baseline.to_json(),
            "points": [p.to_json() for p in points],
            "pareto": [p.to_json() for p in front],
            "recommended": best.to_json() if best else None,
            "refined": bool(refined),
        }
        click.echo(json.dumps(report, indent=2))
        return
    click.echo("Pareto front (throughput, p99):")
    for point in front:
        click.echo(_row(point))
    if best is None or best.candidate is None:
        click.echo(f"no candidate met '{goal}' at any rate; keep the live settings")
        return
    if baseline.throughput:
        gain = f"×{best.throughput / baseline.throughput:.2f}"
    else:
        gain = "the live settings met it at no rate"
    click.echo(
        f"recommended for '{goal}': {best.candidate.label()} ({best.throughput:.1f} req/s "
        f"vs {baseline.throughput:.1f} live, {gain}"
        f"{', measured side by side' if refined else ''})"
    )
    chosen = best.candidate
    entry = {
        "name": model,
        "scheduler_mode": chosen.mode,
        "dynamic_batching": {
            "max_batch": chosen.max_batch,
            "max_queue_delay_microseconds": chosen.delay_us,
        },
    }
    document = {"models": [entry]}
    click.echo("# sordino reconfigure --file tuned.yaml")
    import yaml

    click.echo(yaml.safe_dump(document, sort_keys=False), nl=False)
