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
    lines = [f"{n:05d}" + "x" * 94 + "\n" for n in range(5_000)]
    started = time.monotonic()
    for line in lines:  # 500 KB into a 64 KiB pipe nobody reads
        output.put(stream, line)
    assert time.monotonic() - started < 5  # (a blocked write would wait forever)
    assert not output.drain(0.2)  # still waiting for the reader
    output.put(stream, "last\n")  # dropped too: past the limit while nothing is read
    text = _read_all(read, b"while they came]\n").decode()
    output.put(stream, "after\n")  # the reader reads again: nothing is dropped
    text += _read_all(read, b"after\n").decode()
    assert text.endswith("stream was not read while they came]\nafter\n")
    assert output.drain(5)
    # Each line kept is whole and in order, and each gap between the lines kept (the
    # one after the last line kept counts "last" too) is said by one notice standing
    # in it, with the gap's exact characters.
    written = [*lines, "last\n"]
    last_kept, notice, notices = -1, None, 0
    for row in [*text.removesuffix("after\n").splitlines(keepends=True), None]:
        if row is not None and row.startswith("[sordino: "):
            assert notice is None  # one notice to a gap
            notice = int(row.split("[sordino: ")[1].split(" characters")[0])
            notices += 1
            continue
        kept = len(written) if row is None else written.index(row)
        assert kept > last_kept
        gap = sum(len(line) for line in written[last_kept + 1 : kept])
        assert notice == (gap or None), (last_kept, kept)
        last_kept, notice = kept, None
    assert notices >= 1
    assert 600 <= text.count("x" * 94) < 5_000  # the pipe's and the queue's worth, not all


def test_a_notice_of_drops_stands_where_the_dropped_text_was() -> None:
    class Gated(io.StringIO):
        """A stream whose first write waits to be let through (a reader not reading)."""

        def __init__(self) -> None:
            super().__init__()
            self.writing, self.go, self.seen = threading.Event(), threading.Event(), []

        def write(self, text: str) -> int:
            self.writing.set()
            assert self.go.wait(10)
            self.seen.append(text)
            return len(text)

    stream = Gated()
    output = BackgroundOutput(limit=10)
    output.put(stream, "one\n")  # taken by the thread, which waits in the write
    assert stream.writing.wait(10)
    output.put(stream, "two\n")  # queued: 8 characters wait
    output.put(stream, "three\n")  # past the limit: dropped
    output.put(stream, "four\n")  # the same run of drops
    stream.go.set()
    assert output.drain(10)
    output.put(stream, "five\n")  # the reader reads again: a new line, kept
    assert output.drain(10)
    notice = "[sordino: 11 characters of output were dropped here: this stream was not "
    assert stream.seen == ["one\n", "two\n", notice + "read while they came]\n", "five\n"]


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
