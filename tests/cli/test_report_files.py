"""``write_output``: the file a report command writes, or a clear failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sordino.cli.report_files import ReportFailure, write_output, write_report


def test_a_report_lands_whole_with_its_folder(tmp_path: Path) -> None:
    write_output(tmp_path / "new" / "r.html", "<p>é</p>")
    assert (tmp_path / "new" / "r.html").read_text(encoding="utf-8") == "<p>é</p>"
    for name in ("r.pdf", "r.html"):
        write_report(tmp_path / name, lambda: "<p>html</p>", lambda t: t.write(b"%PDF-1.4 ..."))
    assert (tmp_path / "r.pdf").read_bytes() == b"%PDF-1.4 ..."
    assert (tmp_path / "r.html").read_text(encoding="utf-8") == "<p>html</p>"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_a_full_disk_is_a_clear_failure() -> None:
    """``/dev/full`` answers every write with ENOSPC, as a full disk does."""
    with pytest.raises(ReportFailure) as caught:
        write_output(Path("/dev/full"), "x" * 100_000)
    assert str(caught.value) == (
        "cannot write /dev/full (No space left on device): give another path, or free room "
        "on its disk"
    )
    assert os.path.exists("/dev/full")  # what the write did not begin is never removed


def test_a_partial_file_is_not_left(tmp_path: Path) -> None:
    """A write that fails half-way (RLIMIT_FSIZE stands for a full disk here) leaves no
    truncated report behind."""
    script = (
        "import resource, signal, sys\n"
        "from pathlib import Path\n"
        "from sordino.cli.report_files import ReportFailure, write_output\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
        "try:\n"
        "    write_output(Path(sys.argv[1]), 'x' * 100_000)\n"
        "except ReportFailure as exc:\n"
        "    print(exc)\n"
    )
    target = tmp_path / "r.html"
    done = subprocess.run(
        [sys.executable, "-c", script, str(target)], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.startswith(f"cannot write {target} (File too large)"), done
    assert not target.exists()
