"""HTTP transport details side by side with Triton: compressed requests and answers.

Part of ``python -m bench.triton_python_parity`` (its ``main`` calls
:func:`compression_checks` with both servers up): add_sub asked through tritonclient
with each ``request_compression_algorithm`` and ``response_compression_algorithm``
(None, gzip, deflate; JSON and binary tensors), and raw requests for what the answer's
``Content-Encoding`` is for a few ``Accept-Encoding`` values and whether a body that is
not what its ``Content-Encoding`` says, or in a coding neither takes, is refused. What is
compared: the outputs, the status class, the ``Content-Encoding``. Differences kept
(not compared): Triton 2.51 ignores an ``Accept-Encoding`` in capitals (``GZIP``) and
answers an unknown ``Content-Encoding`` 501 where sordino answers 400.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import numpy as np
import tritonclient.http as httpclient

CODINGS = (None, "gzip", "deflate")
ACCEPTS = ("gzip", "deflate", "gzip;q=0, deflate", "br", "identity")
BODY = json.dumps(
    {
        "inputs": [
            {"name": name, "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}
            for name in ("INPUT0", "INPUT1")
        ]
    }
).encode()


def _round_trips(url: str) -> list[Any]:
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    seen = []
    for request_coding in CODINGS:
        for response_coding in CODINGS:
            for binary in (False, True):
                inputs = []
                for name in ("INPUT0", "INPUT1"):
                    tensor = httpclient.InferInput(name, [4], "FP32")
                    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32), binary_data=binary)
                    inputs.append(tensor)
                try:
                    result = client.infer(
                        "add_sub",
                        inputs,
                        request_compression_algorithm=request_coding,
                        response_compression_algorithm=response_coding,
                    )
                    seen.append(result.as_numpy("OUTPUT0").tolist())
                except Exception as exc:  # the outcome compared, not its words
                    seen.append(f"failed: {type(exc).__name__}")
    client.close()
    return seen


def _raw(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, str | None]:
    request = urllib.request.Request(f"{url}/v2/models/add_sub/infer", body, headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            answer.read()
            return answer.status // 100, answer.headers.get("Content-Encoding")
    except urllib.error.HTTPError as exc:
        return exc.code // 100, exc.headers.get("Content-Encoding")


def compression_checks(triton: str, ours: str) -> list[dict[str, Any]]:
    """One check a case, Triton's answer against sordino's (both serving add_sub)."""
    cases: list[tuple[str, Any, Any]] = [
        ("tritonclient compression (request x response x binary)",
         _round_trips(triton), _round_trips(ours)),
    ]  # fmt: skip
    for accept in ACCEPTS:
        cases.append(
            (f"Accept-Encoding {accept!r}",
             _raw(triton, BODY, {"Accept-Encoding": accept}),
             _raw(ours, BODY, {"Accept-Encoding": accept}))
        )  # fmt: skip
    cases.append(
        ("a body that is not gzip, said to be",
         _raw(triton, b"{not gzip", {"Content-Encoding": "gzip"})[0] != 2,
         _raw(ours, b"{not gzip", {"Content-Encoding": "gzip"})[0] != 2)
    )  # fmt: skip
    cases.append(
        ("Content-Encoding br is refused",
         _raw(triton, BODY, {"Content-Encoding": "br"})[0] != 2,
         _raw(ours, BODY, {"Content-Encoding": "br"})[0] != 2)
    )  # fmt: skip
    checks = []
    for what, theirs, mine in cases:
        same = theirs == mine
        checks.append({"check": f"compression: {what}", "protocol": "http", "equal": same,
                       "detail": "" if same else f"triton {theirs}, sordino {mine}"})  # fmt: skip
        print(f"{'ok  ' if same else 'DIFF'} http compression: {what}", flush=True)
    return checks
