"""``sordino stress-test``'s own limits, and its headline on the built-in digits classifier.

Part 1, the client: constant open-loop rates against ``sordino start`` (digits
classifier), each for ``--seconds``: achieved vs intended rate, how late requests left
(send lag), the client's CPU per request, and the latency it measured. The last rate
the client holds within 2 % with a send-lag p99 under 10 ms is its ceiling on this
machine (with the server sharing the cores).

Part 2, the report's headline: the ``black_friday`` profile compressed to
``--profile-seconds`` at ``--peak-rate``, as ``sordino stress-test`` prints it.

    python -m bench.bench_stress [--seconds 8] [--rates 100,200,400,800]
        [--profile-seconds 30] [--peak-rate 200]
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from rich.table import Table

from bench.common import RESULTS, console, sordino_server
from sordino.loadtest.findings import client_warnings
from sordino.loadtest.profiles import load_profile
from sordino.loadtest.report import HEADLINE_HEADER, headline_rows
from sordino.loadtest.run import execute, prepare

MODEL = "digits-classifier"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def client_ceiling(url: str, rates: list[int], seconds: float) -> list[dict[str, float]]:
    rows = []
    for rate in rates:
        steady = load_profile("steady").scaled(duration=seconds, peak_rate=rate)
        plan = prepare(url, MODEL, steady.model_copy(update={"arrivals": "constant"}))
        before = _cpu()
        result = execute(plan, poll_metrics=False)
        cpu = _cpu() - before
        rows.append(
            {
                "intended": result.intended_mean,
                "achieved": result.achieved_mean,
                "lag_p99_ms": result.lag_p99_ms,
                "cpu_us_per_request": cpu / max(result.send.sent, 1) * 1e6,
                "client_cpu_percent": cpu / seconds * 100,
                "p50_ms": result.total.p50_ms or 0.0,
                "p99_ms": result.total.p99_ms or 0.0,
                "errors": result.total.errors,
                "warnings": len(client_warnings(result)),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rates", default="100,200,400,800")
    parser.add_argument("--profile-seconds", type=float, default=30.0)
    parser.add_argument("--peak-rate", type=float, default=200.0)
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    with sordino_server(["--model-control-mode", "none"]) as server:
        ceiling = client_ceiling(server.http, rates, args.seconds)
        profile = load_profile("black_friday").scaled(
            duration=args.profile_seconds, peak_rate=args.peak_rate
        )
        started = time.time()
        headline = execute(prepare(server.http, MODEL, profile))
        elapsed = time.time() - started
    table = Table(title=f"open-loop client, constant arrivals, {args.seconds:g} s per rate")
    for column in ("intended/s", "achieved/s", "achieved %", "send lag p99 ms",
                   "client CPU µs/req", "client CPU %", "p50 ms", "p99 ms", "errors"):  # fmt: skip
        table.add_column(column, justify="right")
    for row in ceiling:
        table.add_row(
            f"{row['intended']:.0f}", f"{row['achieved']:.1f}",
            f"{row['achieved'] / row['intended']:.1%}", f"{row['lag_p99_ms']:.1f}",
            f"{row['cpu_us_per_request']:.0f}", f"{row['client_cpu_percent']:.0f}",
            f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}", f"{row['errors']:.0f}",
        )  # fmt: skip
    console.print(table)
    rows = headline_rows(headline)
    table = Table(
        title=f"black_friday in {args.profile_seconds:g} s, peak {args.peak_rate:g}/s: intended "
        f"{headline.intended_mean:.1f}/s, achieved {headline.achieved_mean:.1f}/s"
    )
    for column in HEADLINE_HEADER:
        table.add_column(column, justify="left" if column == "group" else "right")
    for row in rows:
        table.add_row(*row)
    console.print(table)
    for warning in client_warnings(headline):
        console.print(f"client warning: {warning}")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "stress.json"
    out.write_text(
        json.dumps(
            {"client": ceiling, "headline": headline.to_json(), "headline_wall_s": elapsed},
            indent=1,
        )
    )
    console.print(f"written to {out}")


if __name__ == "__main__":
    main()
