"""A client cancels while a Triton Python model (not decoupled) runs: Triton and sordino alike?

    python -m bench.triton_python_cancel

Serves ``tests/fixtures/triton_python_cancel`` unchanged on ``tritonserver`` (Triton
2.51 from the ``nvidia-pytriton`` 0.7.0 wheel, ``bench/.peers/triton``, as
``bench.triton_python_parity``) and on ``sordino start --model-repository --mode
manual`` (a worker process per model), each from its own copy of the repository. The
models poll ``request.is_cancelled()`` in ``execute`` until every request tagged above
0 is cancelled (at most 20 s) and leave marker files saying what they saw. Three cases,
each the same on both servers:

- gRPC, alone: a request (``async_infer``) is cancelled (``CallContext.cancel()``) once
  ``execute`` runs; then one more request is sent;
- gRPC, in a batch of two: the same, while another request shares its batch;
- HTTP, alone: the client's connection is closed once ``execute`` runs; then one more
  request is sent.

What is compared: whether the model saw ``is_cancelled()`` turn true, what the client
of the cancelled request got, the answer of the batch's other request ([its
is_cancelled(), the batch's size, how many were cancelled]) and of the next request.
The seconds from the cancel to the model's seeing it are shown, not compared.

One difference is known and checked as such (:data:`KNOWN`): Triton cancels requests
from gRPC (and its C API) only ("Request Cancellation" in its user guide), so a model
served by Triton never sees ``is_cancelled()`` when an HTTP client leaves, and runs
the request to its end; sordino cancels it then too. Prints one line per case and a
verdict; exit status 0 when every case matched (or differed exactly as known), 1
otherwise, 2 when a server could not be installed or started. Results go to
``bench/results/triton_python_cancel.json``.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench import peers
from bench.common import save, sordino_server

REPOSITORY = Path(__file__).parent.parent / "tests" / "fixtures" / "triton_python_cancel"
WAIT_S = 30.0
"""How long a case waits for the model (its own give-up is 20 s)."""


def _wait(condition: Callable[[], bool], timeout: float = WAIT_S) -> bool:
    ends = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > ends:
            return False
        time.sleep(0.01)
    return True


def _inputs(value: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return [tensor]


def _seen(folder: Path, tag: int, cancelled_at: float) -> dict[str, Any]:
    """What the model left for request ``tag``: whether it saw the cancel, and when."""
    ended = _wait((folder / f"ended-{tag}").exists)
    mark = folder / f"cancelled-{tag}"
    saw = mark.exists()
    # File times are a few ms coarse here: a figure, never compared.
    after = max(0.0, round(os.stat(mark).st_mtime - cancelled_at, 3)) if saw else None
    return {"execute ended": ended, "saw is_cancelled()": saw, "seconds to see": after}


def grpc_cancel(address: str, folder: Path, model: str, tag: int, partner: bool) -> dict[str, Any]:
    """Cancel request ``tag`` over gRPC once it runs (with a partner in its batch)."""
    client = grpcclient.InferenceServerClient(address)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    other: queue.Queue[Any] = queue.Queue()
    try:
        call = client.async_infer(
            model, _inputs(tag), lambda result, error: answers.put((result, error))
        )
        if partner:
            threading.Thread(
                target=lambda: other.put(client.infer(model, _inputs(0)).as_numpy("Y").tolist()),
                daemon=True,
            ).start()
        if not _wait((folder / f"running-{tag}").exists):
            return {"error": "the request never ran"}
        cancelled_at = time.time()
        call.cancel()
        seen = _seen(folder, tag, cancelled_at)
        result, error = answers.get(timeout=WAIT_S)
        seen["client got"] = (
            f"error {error.status()}" if error is not None else result.as_numpy("Y").tolist()
        )
        if partner:
            seen["the batch's other request got"] = other.get(timeout=WAIT_S)
        seen["next request got"] = client.infer(model, _inputs(0)).as_numpy("Y").tolist()
    finally:
        client.close()
    return seen


def http_leave(url: str, folder: Path, model: str, tag: int) -> dict[str, Any]:
    """Close the HTTP connection of request ``tag`` once it runs."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(
        {"inputs": [{"name": "X", "shape": [1, 1], "datatype": "INT32", "data": [tag]}]}
    ).encode()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=WAIT_S) as conn:
        conn.sendall(head + body)
        if not _wait((folder / f"running-{tag}").exists):
            return {"error": "the request never ran"}
        cancelled_at = time.time()
    seen = _seen(folder, tag, cancelled_at)
    client = httpclient.InferenceServerClient(url=url.removeprefix("http://"))
    try:
        tensor = httpclient.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[0]], np.int32))
        seen["next request got"] = client.infer(model, [tensor]).as_numpy("Y").tolist()
    finally:
        client.close()
    return seen


CASES: list[tuple[str, str, int]] = [
    ("grpc cancel, alone", "waits_alone", 11),
    ("grpc cancel, batch of two", "waits", 21),
    ("http disconnect, alone", "waits_alone", 31),
]


def run_cases(http: str, grpc: str, repo: Path) -> dict[str, dict[str, Any]]:
    """Every case against one server (``repo`` is its copy of the repository)."""
    out: dict[str, dict[str, Any]] = {}
    for what, model, tag in CASES:
        folder = repo / model
        if what.startswith("grpc"):
            out[what] = grpc_cancel(grpc, folder, model, tag, partner=model == "waits")
        else:
            out[what] = http_leave(http, folder, model, tag)
    return out


KNOWN: dict[str, tuple[str, Callable[[dict[str, Any], dict[str, Any]], bool]]] = {
    "http disconnect, alone": (
        "Triton cancels gRPC requests only: its model never sees the HTTP client leave",
        lambda theirs, ours: (
            theirs.get("saw is_cancelled()") is False
            and ours.get("saw is_cancelled()") is True
            and _compared(theirs, "saw is_cancelled()") == _compared(ours, "saw is_cancelled()")
        ),
    ),
}
"""The cases known to differ: why, and the check that they differ exactly so."""


def _compared(seen: dict[str, Any], *left_out: str) -> dict[str, Any]:
    skip = {"seconds to see", *left_out}
    return {key: value for key, value in seen.items() if key not in skip}


def main() -> None:
    scratch = tempfile.TemporaryDirectory(prefix="sordino-cancel-")
    theirs_repo = Path(scratch.name) / "triton"
    ours_repo = Path(scratch.name) / "sordino"
    shutil.copytree(REPOSITORY, theirs_repo)
    shutil.copytree(REPOSITORY, ours_repo)
    try:
        python = peers.ensure_venv("triton", peers.TRITON_PACKAGES,
                                   "import pytriton, onnxruntime, numpy")  # fmt: skip
        with peers.triton_on(python, theirs_repo) as triton:
            theirs = run_cases(triton.http, triton.grpc or "", theirs_repo)
        args = ["--model-repository", str(ours_repo), "--no-builtin", "--mode", "manual"]
        with sordino_server(args) as server:
            ours = run_cases(server.http, server.grpc, ours_repo)
    except peers.PeerError as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        sys.exit(2)
    finally:
        scratch.cleanup()
    checks = []
    for what, _, _ in CASES:
        same = _compared(theirs[what]) == _compared(ours[what])
        known = KNOWN.get(what)
        as_known = not same and known is not None and known[1](theirs[what], ours[what])
        checks.append({"check": what, "equal": same, "known_difference": as_known,
                       "why": known[0] if as_known and known else "",
                       "triton": theirs[what], "sordino": ours[what]})  # fmt: skip
        verdict = "ok  " if same else "KNOWN" if as_known else "DIFF"
        print(f"{verdict} {what}" + (f" ({known[0]})" if as_known and known else "")
              + f"\n     triton  {theirs[what]}\n     sordino {ours[what]}")  # fmt: skip
    differing = [c for c in checks if not c["equal"] and not c["known_difference"]]
    alike = sum(1 for c in checks if c["equal"])
    known_count = sum(1 for c in checks if c["known_difference"])
    print(f"{alike}/{len(checks)} cases alike, {known_count} known difference(s), "
          f"{len(differing)} unexpected")  # fmt: skip
    save("triton_python_cancel", {"repository": str(REPOSITORY), "checks": checks})
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
