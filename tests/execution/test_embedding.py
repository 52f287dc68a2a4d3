"""Worker processes start from a plain script that embeds sordino, with no main guard."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import time

    import httpx
    from sordino.testing import serve_in_thread

    print("script body ran")  # spawn would print this again if it re-ran the script
    with serve_in_thread() as server:
        body = {"inputs": [{"name": "pixels", "shape": [1, 64], "datatype": "FP32",
                            "data": [1.0] * 64}]}
        r = httpx.post(f"{server.url}/v2/models/digits-classifier/infer", json=body)
        r.raise_for_status()
        for _ in range(300):  # the telemetry hub samples resources once a second
            pools = httpx.get(f"{server.url}/v2/sordino/telemetry").json()["resources"]["pools"]
            if pools:
                break
            time.sleep(0.1)
        print("arena", [p["name"] for p in pools])
    """
)


def test_unguarded_script_starts_workers_once(tmp_path: Path) -> None:
    script = tmp_path / "embed.py"
    script.write_text(SCRIPT)
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("script body ran") == 1
    assert "arena ['shm_arena']" in result.stdout
