"""``BackgroundOutput``: the server's standard streams written by a thread of their own,
so that a reader that does not read (a full pipe) never blocks the writer."""

from __future__ import annotations

import io
import os
import threading
import time
from typing import TextIO

from sordino.execution.lost_streams import BackgroundOutput


def _pipe() -> tuple[TextIO, int]:
    """A text stream onto a pipe nobody reads yet (64 KiB fill it), and the read end."""
    read, write = os.pipe()
    return io.TextIOWrapper(os.fdopen(write, "wb", buffering=0), write_through=True), read


def _read_all(fd: int, until: bytes, timeout: float = 30) -> bytes:
    got = b""
    ends = time.monotonic() + timeout
    while until not in got and time.monotonic() < ends:
        got += os.read(fd, 1 << 20)
    return got


def test_writes_return_while_the_reader_does_not_read_and_the_drops_are_said() -> None:
    stream, read = _pipe()
    output = BackgroundOutput(limit=200_000)
    line = "x" * 99 + "\n"
    started = time.monotonic()
    for _ in range(5_000):  # 500 KB into a 64 KiB pipe nobody reads
        output.put(stream, line)
    assert time.monotonic() - started < 5  # (a blocked write would wait forever)
    assert not output.drain(0.2)  # still waiting for the reader
    output.put(stream, "last\n")  # dropped too: past the limit while nothing is read
    text = _read_all(read, b"while they came]\n").decode()
    kept = text.count(line)
    assert 600 <= kept < 5_000, kept  # the pipe's and the queue's worth, not all
    dropped = int(text.split("[sordino: ")[1].split(" characters")[0])
    assert dropped == (5_000 - kept) * len(line) + len("last\n")
    assert text.endswith("stream was not read while they came]\n")
    output.put(stream, "after\n")  # the reader reads again: nothing is dropped
    assert _read_all(read, b"after\n").endswith(b"after\n")
    assert output.drain(5)


def test_two_streams_keep_the_order_of_the_writes() -> None:
    class Recorder(io.StringIO):
        def __init__(self, name: str, seen: list[str]) -> None:
            super().__init__()
            self.name_, self.seen = name, seen

        def write(self, text: str) -> int:
            self.seen.append(f"{self.name_}:{text}")
            return len(text)

    seen: list[str] = []
    out, err = Recorder("out", seen), Recorder("err", seen)
    output = BackgroundOutput()
    writers = [out, err] * 500
    for n, stream in enumerate(writers):
        output.put(stream, str(n))
    assert output.drain(10)
    assert seen == [f"{s.name_}:{n}" for n, s in enumerate(writers)]


def test_a_write_from_any_thread_never_waits_for_the_writer() -> None:
    stream, read = _pipe()
    output = BackgroundOutput(limit=1_000)
    done = threading.Event()

    def flood() -> None:
        for _ in range(100_000):
            output.put(stream, "y" * 50)
        done.set()

    threading.Thread(target=flood, daemon=True).start()
    assert done.wait(30)
    os.close(read)
