"""Shared-memory segments have every page backed at creation, so a /dev/shm that fills
up later (a client's region, another program, a container's 64 MB default) cannot end
the server: before, the arena was a hole whose pages were taken on first write, and the
first write after /dev/shm filled up raised SIGBUS — the server died on the spot, every
request in flight lost, nothing in its log."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import sordino
from sordino.errors import OutOfMemory
from sordino.memory import segments
from sordino.memory.arena import Arena
from sordino.memory.segments import create_segment, reserve
from sordino.server.load_board import LoadBoard

SRC = Path(sordino.__file__).resolve().parent.parent  # the sordino under test


def _backed(name: str) -> int:
    """Bytes of /dev/shm the segment ``name`` holds now."""
    return os.stat(f"/dev/shm/{name}").st_blocks * 512


def test_an_arena_and_a_load_board_hold_their_pages_from_the_start(tmp_path: Path) -> None:
    arena = Arena(1 << 20, registry=tmp_path / "shm")
    try:
        assert _backed(arena.name) >= 1 << 20
    finally:
        arena.close()
    board = LoadBoard.create(None)
    try:
        assert _backed(board.name) >= os.stat(f"/dev/shm/{board.name}").st_size > 0
    finally:
        board.close()


def test_no_room_is_a_clear_error() -> None:
    board = LoadBoard.create(None)
    try:
        with pytest.raises(OutOfMemory, match=r"/dev/shm has no room .* --shm-size"):
            reserve(board.name, 1 << 60)  # more than any /dev/shm holds (EFBIG at once)
    finally:
        board.close()


def test_a_segment_without_room_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(name: str, size: int) -> None:
        raise OutOfMemory("/dev/shm has no room")

    monkeypatch.setattr(segments, "reserve", full)
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(OutOfMemory):
        create_segment(tmp_path / "shm", 1 << 20)
    assert set(os.listdir("/dev/shm")) == before
    assert list((tmp_path / "shm").iterdir()) == []  # nor its record


# Run inside a mount namespace of its own (``unshare -m``, private mounts: the host's
# /dev/shm is untouched): a 64 MB /dev/shm as a container has, a server on it, the
# rest of /dev/shm filled by a "client" once it serves, then 512 requests.
_INSIDE = """
import collections, concurrent.futures, json, re, subprocess, sys, urllib.request
subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", "/dev/shm"], check=True)
server = subprocess.Popen(
    [sys.executable, "-m", "sordino", "start", "--http-port", "0", "--grpc-port", "0",
     "--data-dir", sys.argv[1]],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
)
lines = []
for line in server.stdout:
    lines.append(line)
    found = re.search(r"listening on (http://\\S+)", line)
    if found:
        url = found.group(1)
        break
else:
    print(json.dumps({"log": lines}))
    sys.exit(1)
with open("/dev/shm/a_client_region", "wb", buffering=0) as region:  # every byte left
    try:
        while True:
            region.write(b"\\0" * (1 << 20))
    except OSError:
        pass
rows = {"inputs": [{"name": "pixels", "shape": [64, 64], "datatype": "FP32",
                    "data": [1.0] * 4096}]}
body = json.dumps(rows).encode()
def one(_):
    request = urllib.request.Request(f"{url}/v2/models/digits-classifier/infer", body)
    try:
        return urllib.request.urlopen(request, timeout=60).status
    except Exception as exc:
        return type(exc).__name__
with concurrent.futures.ThreadPoolExecutor(32) as pool:
    answers = collections.Counter(pool.map(one, range(512)))
alive = server.poll() is None
server.terminate()
lines += server.communicate(timeout=60)[0].splitlines(keepends=True)
print(json.dumps({"answers": answers, "alive": alive, "log": lines[-20:]}))
"""


def test_a_dev_shm_filled_after_start_costs_no_request(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and util-linux's unshare (a mount namespace of its own)")
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    result = subprocess.run(
        ["unshare", "-m", sys.executable, "-c", _INSIDE, str(tmp_path / "data")],
        capture_output=True, text=True, timeout=240, env=env,
    )  # fmt: skip
    if "unshare failed" in result.stderr or "Operation not permitted" in result.stderr:
        pytest.skip(f"no mount namespace here: {result.stderr.strip()}")
    assert result.returncode == 0, result.stdout + result.stderr
    outcome = json.loads(result.stdout.splitlines()[-1])
    log = "".join(outcome["log"])
    assert outcome["alive"], log
    assert outcome["answers"] == {"200": 512}, log
