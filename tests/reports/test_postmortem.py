"""``sordino event mark`` and ``sordino postmortem`` on a journal recorded here.

A real server journals a drill: premium and standard traffic, a chaos latency fault,
and two guardian actions (written as the guardian branch journals them: kind
``guardian``, one held, one rolled back). The postmortem, run on a copy of the data
directory after the server is gone, must list both with the right times and outcomes.
"""

from __future__ import annotations

import datetime as dt
import re
import shutil
import threading
import time
from base64 import b64decode
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from pypdf import PdfReader

from sordino.cli.main import cli
from sordino.config import load_config
from sordino.control.client import AdminClient
from sordino.loadtest.profiles import Profile, Segment, TrafficClass
from sordino.loadtest.run import execute, prepare
from sordino.loadtest.sender import Progress
from sordino.models.repository import builtin_sources
from sordino.testing import serve_in_thread

TOKEN = "postmortem-test-token"
PRIORITIES = [{"name": "stream_priority", "rules": [{"tag": "premium", "priority": "high"}]}]


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    assert "Traceback" not in result.output, result.output
    return result.exit_code, result.output


def _hms(t: float) -> str:
    return dt.datetime.fromtimestamp(t).strftime("%H:%M:%S")


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Record the drill; return the copy of its data directory and what happened when."""
    data = tmp_path_factory.mktemp("live")
    config = load_config(None, {"server.admin_token": TOKEN, "scheduler.strategies": PRIORITIES})
    digits = [s for s in builtin_sources() if s.name == "digits-classifier"]
    recorded: dict[str, Any] = {}
    with serve_in_thread(config, digits, data_dir=data) as server:
        code, out = _cli("event", "mark", "drill", "--start", "--data-dir", str(data))
        assert code == 0, out  # written while the server's own writer runs
        recorded["marked"] = time.time()
        profile = Profile(
            segments=(Segment(duration=8, rate=60),),
            arrivals="constant",
            mix=(TrafficClass(weight=1, tag="premium"), TrafficClass(weight=3, tag="standard")),
        )
        done = threading.Event()

        def inject(progress: Progress) -> None:
            if progress.elapsed_s >= 2.0 and not done.is_set():
                done.set()
                recorded["injected_at"] = time.time()
                admin = AdminClient(server.url, TOKEN)
                threading.Thread(
                    target=admin.inject,
                    args=("worker:digits-classifier", "latency"),
                    kwargs={"latency": "300ms", "duration": "2s"},
                ).start()

        execute(prepare(server.url, "digits-classifier", profile), progress=inject)
        now = time.time()
        events = server.runtime.events

        async def guardian_acted() -> None:  # on the server's loop, as the guardian will
            events.emit(
                "guardian", "digits-classifier", "p99 above target",
                trigger="p99>100ms for 2s", action="grow_batch", started=now - 5.0,
                ended=now - 4.0, verify="p99 under target within 10 s", rolled_back=False,
                explanation="p99 rose to 310 ms; max batch 32 -> 64",
            )  # fmt: skip
            events.emit(
                "guardian", "runtime", "fragmentation above 70%",
                trigger="fragmentation>70%", action="defragment", started=now - 3.0,
                ended=now - 2.0, verify="fragmentation under 50%", rolled_back=True,
                explanation="defragmentation did not lower fragmentation; restored the pool",
            )  # fmt: skip

        server.call(guardian_acted())
        recorded["guardian_at"] = (now - 5.0, now - 3.0)
        code, out = _cli("event", "mark", "drill", "--end", "--data-dir", str(data))
        assert code == 0, out
    copy = tmp_path_factory.mktemp("copy") / "data"
    shutil.copytree(data, copy)  # the server is gone; the postmortem reads a copy
    recorded["data_dir"] = copy
    return recorded


@pytest.mark.timeout(180)
def test_postmortem_lists_the_fault_and_the_guardian_actions(
    drill: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "drill.html"
    code, text = _cli(
        "postmortem", "--event", "drill", "--data-dir", str(drill["data_dir"]),
        "--metrics", "all", "--output", str(out),
    )  # fmt: skip
    assert code == 0, text
    assert "2 guardian action(s)" in text
    html = out.read_text()
    headings = re.findall(r"<h2>([^<]+)</h2>", html)
    assert headings[0] == "Targets"
    assert "availability (successful / received, 4xx client errors excluded)" in html
    # Availability by priority: premium traffic was mapped to priority 1.
    priority = html[html.index("Availability by priority class") :]
    assert re.search(r"<td>priority 1 \(highest\)</td><td>\d+</td>", priority)
    # The chaos fault, at the time it was injected, and its clearing.
    injected = _hms(drill["injected_at"])
    manual = html[html.index("<h2>Manual interventions</h2>") :]
    row = re.search(r"<td>[\d-]+ (\d\d:\d\d:\d\d)</td><td>fault_injected</td>", manual)
    assert row is not None, manual[:2000]
    assert abs(_seconds(row.group(1)) - _seconds(injected)) <= 1
    assert "latency fault +300 ms at rate 1.0 for 2 s (chaos API)" in manual
    assert "fault_cleared" in manual
    assert "event_mark" not in manual  # the marks name the period: not interventions
    # Both guardian actions, at their times, with their outcomes.
    guardian = html[html.index("<h2>Guardian actions</h2>") : html.index("<h2>Manual")]
    held, rolled = drill["guardian_at"]
    assert re.search(
        rf"{_hms(held)}</td><td>p99&gt;100ms for 2s</td><td>grow_batch</td><td>1.0 s</td>"
        r"<td>[^<]*</td><td>succeeded</td>",
        guardian,
    ), guardian
    assert re.search(
        rf"{_hms(rolled)}</td><td>fragmentation&gt;70%</td><td>defragment</td>.*"
        r"<td>rolled back</td>",
        guardian,
    ), guardian
    assert "guardian actions that held (not rolled back)" in html and "1 of 2" in html
    assert "fragmentation&gt;70%&#x27; fired 1 time(s) and 1 action(s) were rolled back" in html
    pngs = [b64decode(m) for m in re.findall(r"base64,([A-Za-z0-9+/=]+)", html)]
    assert len(pngs) == 3 and all(p.startswith(b"\x89PNG") and len(p) > 5000 for p in pngs)


def _seconds(hms: str) -> int:
    h, m, s = (int(x) for x in hms.split(":"))
    return h * 3600 + m * 60 + s


@pytest.mark.timeout(180)
def test_postmortem_pdf_has_the_table_and_charts(drill: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "drill.pdf"
    start = dt.datetime.fromtimestamp(drill["marked"] - 1).strftime("%Y-%m-%d %H:%M:%S")
    code, text = _cli(
        "postmortem", "--event", "drill", "--from", start, "--data-dir", str(drill["data_dir"]),
        "--metrics", "guardian,latency", "--output", str(out),
    )  # fmt: skip
    assert code == 0, text
    reader = PdfReader(out)
    first = reader.pages[0].extract_text()
    assert "Targets" in first and "Guardian actions" in first and "rolled back" in first
    assert "Manual interventions" not in first  # not chosen
    assert len(reader.pages) >= 2  # text, then the latency chart
    assert sum(len(page.images) for page in reader.pages[1:]) >= 1


def test_clear_errors(tmp_path: Path, drill: dict[str, Any]) -> None:
    code, text = _cli("postmortem", "--event", "x", "--data-dir", str(tmp_path), "--output",
                      str(tmp_path / "x.html"))  # fmt: skip
    assert code == 1 and "no journal at" in text
    code, text = _cli("postmortem", "--event", "never-marked", "--data-dir",
                      str(drill["data_dir"]), "--output", str(tmp_path / "x.html"))  # fmt: skip
    assert code == 1 and "no start mark for 'never-marked'" in text
    code, text = _cli("postmortem", "--event", "drill", "--metrics", "cpu", "--data-dir",
                      str(drill["data_dir"]), "--output", str(tmp_path / "x.html"))  # fmt: skip
    assert code == 2 and "use all, or a comma-separated list" in text
    code, text = _cli("event", "mark", "drill", "--data-dir", str(drill["data_dir"]))
    assert code == 2 and "give --start or --end" in text
    code, text = _cli("event", "mark", "drill", "--start", "--data-dir", str(tmp_path))
    assert code == 1 and "no journal at" in text
