"""sordino monitor: --once against a running server, the live view, an absent server."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
from click.testing import CliRunner
from rich.console import Console

from sordino.cli.main import cli
from sordino.cli.monitor_view import live_view, sparkline
from sordino.config import RuntimeConfig
from sordino.testing import RunningServer, serve_in_thread
from tests.waiting import wait_for, wait_for_closed_second


def _traffic(url: str, n: int) -> None:
    body = {
        "inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [2.0] * 64}]
    }
    with httpx.Client(base_url=url, timeout=30) as client:
        for _ in range(n):
            assert client.post("/v2/models/digits-classifier/infer", json=body).status_code == 200


def test_once_prints_the_models_and_current_figures(server: RunningServer) -> None:
    _traffic(server.url, 30)
    wait_for_closed_second(server)
    result = CliRunner().invoke(
        cli,
        ["monitor", "--url", server.url, "--once", "--metrics", "qps,latency,error_rate,mem_frag"],
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "QPS" in result.output and "p99 ms" in result.output and "errors" in result.output
    row = next(line for line in lines if line.startswith("digits-classifier/1"))
    qps, p50, p99, errors = row.split()[1:5]
    assert float(qps) > 0 and float(p99) >= float(p50) > 0 and errors.endswith("%")
    assert any(line.startswith("simple/1") for line in lines)
    # The worker processes' shared-memory arena is the memory pool.
    assert re.search(r"pool \d+ MB/256 MB frag \d+\.\d%", result.output), result.output
    assert "model_loaded" in result.output


def test_once_says_when_there_is_no_memory_pool(thread_server: RunningServer) -> None:
    """Models on server threads use no shared-memory arena: absent, never faked."""
    result = CliRunner().invoke(
        cli, ["monitor", "--url", thread_server.url, "--once", "--metrics", "qps,mem_frag"]
    )
    assert result.exit_code == 0, result.output
    assert "mem_frag n/a (no memory pool)" in result.output


def test_an_unreachable_server_gives_a_message_not_a_traceback() -> None:
    result = CliRunner().invoke(
        cli,
        [
            "monitor",
            "--url",
            "http://127.0.0.1:9",
            "--once",
            "--retries",
            "2",
            "--interval",
            "0.1",
        ],
    )
    assert result.exit_code == 1
    assert "cannot reach http://127.0.0.1:9" in result.output
    assert "attempt 2 of 2" in result.output
    assert "Traceback" not in result.output


def test_unknown_metrics_are_refused_with_the_valid_ones() -> None:
    result = CliRunner().invoke(cli, ["monitor", "--once", "--metrics", "qps,vibes"])
    assert result.exit_code == 2 and "vibes" in result.output and "mem_frag" in result.output


def test_sparkline_scales_to_the_maximum_and_keeps_gaps() -> None:
    assert sparkline([0, 1, 2, 4], width=4) == "▁▂▄█"
    assert sparkline([None, 3], width=3) == "  █"
    assert sparkline([], width=2) == "  "
    # A long history is squeezed into the width, each block the maximum of its share.
    assert sparkline([0] * 50 + [8] + [0] * 49, width=4) == "▁▁█▁"
    assert sparkline([100, 104, 108], width=3, relative=True) == "▁▄█"


def test_sparkline_of_values_too_small_for_the_figure_is_flat() -> None:
    # Fragmentation of 0.01 % to 0.04 % reads "0.0%": no bars may claim otherwise.
    tiny = [0.0001, 0.0004, 0.0002, None]
    assert sparkline(tiny, width=4, resolution=0.0005) == "▁▁▁ "
    assert sparkline([0.0, 0.0, 0.0], width=3) == "▁▁▁"
    assert sparkline([5, 5, 5], width=3, relative=True) == "▁▁▁"
    assert sparkline([0.0, 0.02, 0.04], width=3, resolution=0.0005) == "▁▄█"


def test_live_view_renders_a_snapshot(server: RunningServer) -> None:
    snap: Any = httpx.get(f"{server.url}/v2/sordino/telemetry?seconds=60").json()
    console = Console(width=160, record=True)
    console.print(live_view(snap, ["qps", "latency", "mem_frag", "error_rate", "busy"], server.url))
    text = console.export_text()
    assert "digits-classifier/1" in text and "latest events" in text and "RSS" in text


def test_live_view_draws_no_fragmentation_bars_while_the_figure_reads_zero(
    server: RunningServer,
) -> None:
    snap: Any = httpx.get(f"{server.url}/v2/sordino/telemetry?seconds=60").json()
    resources = snap["resources"]
    count = len(resources["series"]["t"]) or 1
    resources["series"]["t"] = resources["series"]["t"] or [snap["time"]]
    resources["series"]["fragmentation"] = [0.0001 * (i % 4) for i in range(count)]
    resources["current"]["fragmentation"] = 0.0002
    resources["current"]["pool_in_use_bytes"] = resources["current"]["pool_reserved_bytes"] = 1
    console = Console(width=160, record=True)
    console.print(live_view(snap, ["mem_frag"], server.url))
    text = console.export_text()
    assert "frag 0.0%" in text
    frag = next(line for line in text.splitlines() if "  frag " in line)
    bars = frag.split("  frag ", 1)[1].split("  RSS", 1)[0].strip()
    assert bars and set(bars) == {"▁"}, frag


def test_event_marks_show_under_latest_events(tmp_path: Path) -> None:
    """`sordino event mark` writes the journal from its own process; the running server
    reads the mark back, so the monitor's latest events show it."""
    with serve_in_thread(RuntimeConfig(), [], data_dir=tmp_path) as running:
        result = CliRunner().invoke(
            cli, ["event", "mark", "launch-42", "--start", "--data-dir", str(tmp_path)]
        )
        assert result.exit_code == 0, result.output

        def shown() -> bool:
            snap = CliRunner().invoke(cli, ["monitor", "--url", running.url, "--once"])
            events = snap.output.split("latest events:", 1)[-1]
            return "event_mark launch-42 sordino event mark" in events

        wait_for(shown, "the mark under the monitor's latest events")
        marks = running.runtime.events.recent("event_mark")
        assert [(e.subject, e.payload) for e in marks] == [("launch-42", {"edge": "start"})]


def test_live_to_a_pipe_prints_a_snapshot_every_interval(server: RunningServer) -> None:
    """``sordino monitor | tee log``: before, the full-screen view printed nothing until
    it ended, and nothing at all when it was stopped; now a plain snapshot per interval."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sordino", "monitor", "--url", server.url, "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    stop = threading.Timer(60, process.kill)  # a monitor that prints nothing fails, not hangs
    stop.start()
    try:
        assert process.stdout is not None
        lines: list[bytes] = []
        while sum(line.startswith(b"simple/1") for line in lines) < 2:
            line = process.stdout.readline()
            assert line, b"".join(lines).decode(errors="replace")
            lines.append(line)
    finally:
        stop.cancel()
        process.terminate()
        process.wait(30)
    assert any(line.startswith(b"digits-classifier/1") for line in lines)


def test_intervals_and_counts_out_of_range_are_refused_before_anything_runs() -> None:
    """``--interval -1`` ended in a traceback (time.sleep), ``--interval 0`` read the
    server thousands of times a second; ``--top``/``--seconds`` of profile likewise."""
    for args, option in [
        (["monitor", "--interval", "-1"], "--interval"),
        (["monitor", "--interval", "0"], "--interval"),
        (["monitor", "--history", "0"], "--history"),
        (["monitor", "--once", "--retries", "0"], "--retries"),
        (["profile", "--model", "m", "--seconds", "0"], "--seconds"),
        (["profile", "--model", "m", "--seconds", "301"], "--seconds"),
        (["profile", "--model", "m", "--top", "-3"], "--top"),
    ]:
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, (args, result.output)
        assert option in result.output and result.exception is not None, result.output
        assert isinstance(result.exception, SystemExit), result.exception


def test_live_ends_on_an_answer_asking_again_cannot_change(server: RunningServer) -> None:
    """A --history past the server's window answered 400, and the live view retried it
    every interval forever; now it ends, exit 1, with the server's words."""
    process = subprocess.run(
        [sys.executable, "-m", "sordino", "monitor", "--url", server.url, "--history", "100000"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 1, process.stderr
    assert "answered 400" in process.stderr and "between 1 and" in process.stderr
    assert "retrying" not in process.stderr and "Traceback" not in process.stderr
