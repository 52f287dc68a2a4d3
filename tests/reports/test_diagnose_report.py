"""sordino diagnose end to end: a journal recorded with a planted latency spike.

The spike is real chaos: a ``latency`` fault injected through the admin API on the
digits-classifier's worker (+150 ms slept in the worker before each batch, for 10 s)
while two clients send requests. The runtime journals it as ``fault_injected`` and,
when the duration has elapsed, ``fault_cleared``.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from pypdf import PdfReader

from sordino.cli.main import cli
from sordino.config import RuntimeConfig
from sordino.control.client import AdminClient
from sordino.events import Event
from sordino.testing import serve_in_thread
from tests.waiting import wait_for

TOKEN = "diagnose-admin-token"
BODY = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [3.0] * 64}]}

# The detectors judge the spike against the window's own normal seconds, so the
# journal needs normal traffic on both sides of the fault: whole seconds of it, counted
# as the telemetry ticker closes them (a partial second at each end comes on top).
BASELINE_S = 5
FAULT_S = 10
RECOVERY_S = 3


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data_dir = tmp_path_factory.mktemp("journal")
    config = RuntimeConfig.model_validate({"server": {"admin_token": TOKEN}})
    stop = threading.Event()
    answered = threading.Event()
    with serve_in_thread(config, data_dir=data_dir) as server:

        def client() -> None:
            with httpx.Client(base_url=server.url, timeout=30) as c:
                while not stop.is_set():
                    assert (
                        c.post("/v2/models/digits-classifier/infer", json=BODY).status_code == 200
                    )
                    answered.set()
                    time.sleep(0.01)

        def closed_through(second: int) -> bool:
            return (server.runtime.telemetry.series.statistics().last_closed or 0) >= second

        threads = [threading.Thread(target=client) for _ in range(2)]
        for thread in threads:
            thread.start()
        wait_for(answered.is_set, "the first answer")
        first = int(time.time())
        wait_for(
            lambda: closed_through(first + BASELINE_S),
            f"{BASELINE_S} s of normal traffic in the journal",
        )
        injected_at = time.time()
        fault = AdminClient(server.url, TOKEN).inject(
            "worker:digits-classifier", "latency", latency="150ms", duration=f"{FAULT_S}s"
        )

        def cleared() -> list[Event]:
            return [
                e
                for e in server.runtime.events.recent()
                if e.kind == "fault_cleared" and e.payload.get("id") == fault["id"]
            ]

        wait_for(cleared, f"the {FAULT_S} s fault to expire", timeout=FAULT_S + 30)
        recovered = int(cleared()[0].time) + RECOVERY_S
        wait_for(
            lambda: closed_through(recovered),
            f"{RECOVERY_S} s of normal traffic in the journal after the fault",
        )
        stop.set()
        for thread in threads:
            thread.join()
        applied = server.runtime.executor.statistics().faults_applied
        # Leaving the block stops the server, which journals the second still open.
    yield {"data_dir": data_dir, "injected_at": injected_at, "fault": fault, "applied": applied}


def _diagnose(data_dir: Path, output: Path, *extra: str) -> Any:
    return CliRunner().invoke(
        cli, ["diagnose", "--data-dir", str(data_dir), "--time-range", "last_1h",
              "--output", str(output), *extra],
    )  # fmt: skip


@pytest.mark.timeout(120)
def test_html_report_names_the_window_and_the_chaos_event(
    recorded: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "runtime_health.html"
    result = _diagnose(recorded["data_dir"], out)
    assert result.exit_code == 0, result.output
    assert recorded["fault"]["kind"] == "latency" and recorded["applied"] > 10
    assert "likely cause: fault_injected on worker:digits-classifier" in result.output
    html = out.read_text()
    injected = recorded["injected_at"]
    start = dt.datetime.fromtimestamp(injected).strftime("%H:%M:%S")
    end = dt.datetime.fromtimestamp(injected + FAULT_S).strftime("%H:%M:%S")
    # The injection's finding: the one the chaos event explains (a busy machine may add
    # a short spike of its own, which comes first when it came first).
    starts = [m.start() for m in re.finditer(r"Finding \d+: latency spike", html)]
    blocks = [html[at : html.index("</div>", at)] for at in starts]
    caused = [block for block in blocks if "fault_injected" in block]
    assert caused, blocks
    match = caused[0]
    assert "p99 latency of digits-classifier rose" in match
    # The window found starts with the injection and lasts about its FAULT_S seconds.
    window = re.search(r"from (\d\d:\d\d:\d\d) to (\d\d:\d\d:\d\d)", match)
    assert window is not None, match
    assert abs(_seconds(window.group(1)) - _seconds(start)) <= 2, (window.group(0), start)
    # The backlog built during the injection may take a few seconds to drain.
    assert -2 <= _seconds(window.group(2)) - _seconds(end) <= 6, (window.group(0), end)
    assert "Likely cause: fault_injected on worker:digits-classifier" in match
    assert "data:image/png;base64," in html
    assert "No tuning is needed" in html and "a latency fault" in html


def _seconds(hms: str) -> int:
    h, m, s = (int(x) for x in hms.split(":"))
    return h * 3600 + m * 60 + s


@pytest.mark.timeout(120)
def test_pdf_report_has_pages_with_images(recorded: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "runtime_health.pdf"
    result = _diagnose(recorded["data_dir"], out, "--focus", "latency_spike")
    assert result.exit_code == 0, result.output
    reader = PdfReader(out)
    assert len(reader.pages) >= 2
    text = reader.pages[0].extract_text()
    assert "fault_injected" in text and "latency spike" in text
    assert sum(len(page.images) for page in reader.pages) >= 2


def test_an_empty_or_missing_journal_gives_a_clear_message(tmp_path: Path) -> None:
    result = _diagnose(tmp_path / "none", tmp_path / "r.html")
    assert result.exit_code == 1 and "no journal at" in result.output
    from sordino.telemetry.journal import Journal

    journal = Journal(tmp_path / "empty" / "journal.sqlite3")
    journal.open()
    journal.close()
    result = _diagnose(tmp_path / "empty", tmp_path / "r.html")
    assert result.exit_code == 1 and "is empty" in result.output
    assert "Traceback" not in result.output
    bad = CliRunner().invoke(cli, ["diagnose", "--output", str(tmp_path / "r.txt")])
    assert bad.exit_code == 2 and ".html or .pdf" in bad.output


@pytest.mark.timeout(120)
@pytest.mark.parametrize("suffix", [".html", ".pdf"])
def test_a_report_that_cannot_be_written_says_so(
    recorded: dict[str, Any], tmp_path: Path, suffix: str
) -> None:
    """A read-only place or a full disk ended the command in a traceback (a PDF on a
    full disk in a zlib error). A file standing where the report's folder would be is
    the failure a test can make for real."""
    (tmp_path / "a-file").write_text("not a folder", encoding="utf-8")
    out = tmp_path / "a-file" / f"report{suffix}"
    result = _diagnose(recorded["data_dir"], out)
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (
        f"error: cannot write {out}: a file stands where its folder would be; give another path"
    )
    assert result.exception is None or isinstance(result.exception, SystemExit)
