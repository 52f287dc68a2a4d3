"""The pure parts of bench/trace_c1.py: the marks find their lines, the copy compiles,
and the breakdown cuts merged marks into requests.

The run itself (a server and a closed loop) is exercised by running the script.
"""

from __future__ import annotations

import py_compile
from pathlib import Path

from bench import trace_c1

SRC = Path(__file__).resolve().parents[2] / "src"


def test_every_mark_finds_its_line_once_and_the_copy_compiles(tmp_path: Path) -> None:
    """A mark whose anchor line changed ends the script by name; here, before a run."""
    copy = trace_c1.instrument(SRC, tmp_path)
    package = copy / "sordino"
    for path in {path for path, *_ in trace_c1.MARKS}:
        py_compile.compile(str(package / path), doraise=True)
    text = "".join((package / path).read_text() for path in {p for p, *_ in trace_c1.MARKS})
    for _, _, name, _ in trace_c1.MARKS:
        assert text.count(f"_sordino_mark({name!r})") == 1, name
    assert "_sordino_mark" not in (SRC / "sordino" / "scheduling" / "loop.py").read_text()


def test_the_breakdown_merges_processes_by_time_and_keeps_the_usual_way(tmp_path: Path) -> None:
    first = trace_c1.FIRST
    front, worker = tmp_path / "1", tmp_path / "2"
    lines_front, lines_worker = [], []
    for k in range(12):  # request k starts at 1000 k ns; its worker step 100 ns later
        at = 1000 * k
        lines_front += [f"{first}\t{at}", f"front: b\t{at + 300}"]
        if k != 5:  # one request took another way: left out
            lines_worker.append(f"worker: a\t{at + 100}")
    front.write_text("\n".join(lines_front) + "\n")
    worker.write_text("\n".join(lines_worker) + "\n")
    way, steps, total = trace_c1.breakdown(tmp_path, skip=0.0)
    assert way == [first, "worker: a", "front: b"]
    assert total == 11  # the last request is cut (its marks may be partly unwritten)
    assert [sorted(set(step)) for step in steps] == [[0.1], [0.2]]  # µs
    assert len(steps[0]) == 10
