"""Each request's facts in a Triton Python model, on Triton itself and on sordino: equal?

    python -m bench.triton_python_facts

Serves ``tests/fixtures/triton_python_facts`` (``echo_facts``, which echoes
``request_id()``, ``correlation_id()``, ``parameters()`` and
``requested_output_names()`` of each request into an output, and a sequence-batched
copy) unchanged on ``tritonserver`` (Triton 2.51 from the ``nvidia-pytriton`` 0.7.0
wheel, ``bench/.peers/triton``, as ``bench.triton_python_parity``) and on ``sordino
start --model-repository``, sends the same requests with ``tritonclient`` over HTTP
and gRPC to both, and compares what the model saw: the id, the correlation ID (an int,
or a string), the flags (sequence start and end), the timeout, the parameters string
(exactly; over gRPC, whose parameters are a protobuf map with no order, as JSON) and
the requested output names (as a set: Triton returns a Python ``set``, sordino a
sorted list). Then ``bls_facts`` calls ``echo_facts`` through BLS with each of its own
cases (an id, parameters as a dict and as JSON text, a timeout, a sequence's
correlation ID and flags, int and string, every output, a version) and answers what the
callee saw: compared the same way. Prints one line per check and a verdict; exit status 0 when all
matched, 1 when something differed, 2 when a server could not be installed or
started. Results go to ``bench/results/triton_python_facts.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench import peers
from bench.common import save, sordino_server

REPOSITORY = Path(__file__).parent.parent / "tests" / "fixtures" / "triton_python_facts"
COMPARED = ("id", "correlation_id", "parameters", "flags", "timeout", "outputs")

# (what, model, requested outputs, infer keyword arguments), each sent as one request.
CASES: list[tuple[str, str, tuple[str, ...], dict[str, Any]]] = [
    ("no id, no parameters, every output", "echo_facts", (), {}),
    (
        "id, parameters of each type, outputs named",
        "echo_facts",
        ("FACTS", "Y"),
        {"request_id": "req-7", "parameters": {"mode": "fast", "n": 3, "flag": True, "r": 0.5}},
    ),
    ("one output named", "echo_facts", ("FACTS",), {"request_id": "only-facts"}),
    (
        "priority and timeout are consumed",
        "echo_facts",
        (),
        {"priority": 1, "timeout": 60_000_000, "parameters": {"kept": "yes"}},
    ),
    (
        "sequence start, int id",
        "echo_facts_sequence",
        (),
        {"sequence_id": 42, "sequence_start": True, "parameters": {"turn": 0}},
    ),
    ("sequence end, int id", "echo_facts_sequence", (), {"sequence_id": 42, "sequence_end": True}),
    (
        "sequence start and end, string id",
        "echo_facts_sequence",
        (),
        {"sequence_id": "session-a", "sequence_start": True, "sequence_end": True},
    ),
]


def _ask(mod: Any, client: Any, model: str, outputs: tuple[str, ...], kw: dict[str, Any]) -> Any:
    tensor = mod.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[5]], dtype=np.int32))
    requested = [mod.InferRequestedOutput(name) for name in outputs] or None
    result = client.infer(model, [tensor], outputs=requested, **kw)
    seen: dict[str, Any] = json.loads(result.as_numpy("FACTS")[0][0])
    # Triton's requested_output_names() is a Python set (pybind11 of a std::set): its
    # order is the process's string hashing, so only the names are compared.
    seen["outputs"] = sorted(seen["outputs"])
    return {key: seen[key] for key in COMPARED}


def _same(protocol: str, theirs: dict[str, Any], ours: dict[str, Any]) -> tuple[bool, str]:
    if theirs == ours:
        return True, ""
    unordered = protocol == "grpc" and json.loads(theirs["parameters"]) == json.loads(
        ours["parameters"]
    )
    rest = all(theirs[k] == ours[k] for k in COMPARED if k != "parameters")
    if unordered and rest:
        return True, "(parameters equal as JSON; a gRPC map has no order)"
    return False, f"triton {theirs} sordino {ours}"


def compare(triton: peers.Server, http: str, grpc: str) -> list[dict[str, Any]]:
    """Send every case to both servers over both protocols; one record per check."""
    checks: list[dict[str, Any]] = []
    ends = [
        ("http", httpclient, httpclient.InferenceServerClient(url=triton.http.removeprefix("http://")),
         httpclient.InferenceServerClient(url=http.removeprefix("http://"))),
        ("grpc", grpcclient, grpcclient.InferenceServerClient(triton.grpc or ""),
         grpcclient.InferenceServerClient(grpc)),
    ]  # fmt: skip
    for protocol, mod, theirs, ours in ends:
        for what, model, outputs, kw in CASES:
            try:
                expected = _ask(mod, theirs, model, outputs, kw)
                got = _ask(mod, ours, model, outputs, kw)
                same, detail = _same(protocol, expected, got)
                if same and not detail:
                    detail = json.dumps(got)
            except Exception as exc:  # one server refused: a difference, shown as such
                same, detail = False, f"{type(exc).__name__}: {exc}"
            checks.append({"check": what, "protocol": protocol, "equal": same, "detail": detail})
            print(f"{'ok  ' if same else 'DIFF'} {protocol:4} {what}: {detail}")
        theirs.close()
        ours.close()
    return checks


BLS_CASES = (
    "BLS: no arguments but the input",
    "BLS: request_id, parameters as a dict",
    "BLS: parameters as JSON text",
    "BLS: timeout",
    "BLS: sequence start, int correlation ID",
    "BLS: sequence start and end, string correlation ID",
    "BLS: every output",
    "BLS: model_version 1",
)
"""What each of ``bls_facts``' cases (its CASE input, in order) sets up."""


def _ask_bls(client: httpclient.InferenceServerClient, case: int) -> Any:
    tensor = httpclient.InferInput("CASE", [1], "INT32")
    tensor.set_data_from_numpy(np.array([case], dtype=np.int32))
    seen = json.loads(client.infer("bls_facts", [tensor]).as_numpy("FACTS")[0])
    if isinstance(seen, dict) and "outputs" in seen:
        seen["outputs"] = sorted(seen["outputs"])
        return {key: seen[key] for key in COMPARED}
    return seen


def compare_bls(triton: str, ours: str) -> list[dict[str, Any]]:
    """Each BLS case on both servers: what the callee saw, compared."""
    checks: list[dict[str, Any]] = []
    theirs_client = httpclient.InferenceServerClient(url=triton.removeprefix("http://"))
    ours_client = httpclient.InferenceServerClient(url=ours.removeprefix("http://"))
    for case, what in enumerate(BLS_CASES):
        expected, got = _ask_bls(theirs_client, case), _ask_bls(ours_client, case)
        same = expected == got
        detail = json.dumps(got) if same else f"triton {expected} sordino {got}"
        checks.append({"check": what, "protocol": "http", "equal": same, "detail": detail})
        print(f"{'ok  ' if same else 'DIFF'} http {what}: {detail}")
    theirs_client.close()
    ours_client.close()
    return checks


def main() -> None:
    try:
        python = peers.ensure_venv("triton", peers.TRITON_PACKAGES,
                                   "import pytriton, onnxruntime, numpy")  # fmt: skip
        with (
            peers.triton_on(python, REPOSITORY.resolve()) as triton,
            sordino_server(["--model-repository", str(REPOSITORY), "--no-builtin"]) as ours,
        ):
            checks = compare(triton, ours.http, ours.grpc)
            checks += compare_bls(triton.http, ours.http)
    except peers.PeerError as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        sys.exit(2)
    differing = [c for c in checks if not c["equal"]]
    print(f"{len(checks) - len(differing)}/{len(checks)} checks equal")
    save("triton_python_facts", {"repository": str(REPOSITORY), "checks": checks})
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
