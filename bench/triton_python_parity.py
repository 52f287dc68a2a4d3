"""Triton Python-backend repositories served by Triton itself and by sordino: same answers?

    python -m bench.triton_python_parity            # the repositories of the tests
    python -m bench.triton_python_parity --repository DIR

Serves one model repository, unchanged, on ``tritonserver`` (the ``nvidia-pytriton``
0.7.0 wheel, Triton 2.51, through its Python backend; installed on first use into
``bench/.peers/triton`` as ``bench_triton`` does) and on ``sordino start
--model-repository``, then sends the same requests with ``tritonclient`` over HTTP and
gRPC to both and compares every output (exact equality) and the metadata (input and
output names, datatypes, shapes). The decoupled examples (``repeat_int32``,
``square_int32``) are streamed instead, over gRPC ``ModelStreamInfer`` (every response,
with the empty final one) and HTTP ``generate_stream`` (every event), and both servers
must refuse a unary ``infer`` on them. A model of the bench's own answers with each of
Triton's error codes (both servers must give the same status and message), another
returns outputs in other datatypes than it declares (the same datatypes and values), a
decoupled one sends error responses within its stream (streamed as the examples are), and
a last one calls it through BLS (Triton's BLS drops the error in the stream: a known
difference, printed ``KNOWN``, not failing the verdict); one more has three versions and
a ``version_policy`` (which are served, what each answers), and a last one is slow on its
first batch only, then asked with short timeouts (answered or refused); two Triton
ensembles chain the examples (metadata, configuration and answers compared), and a
model with an optional input is asked with and without it, and one with
``model_warmup`` says what it ran before its first request; both servers have a local
response cache, and a model that enables it is asked the same inputs again (answers,
statistics and the ``nv_cache_*`` families compared). Then both serve the
repository again in explicit model control, started with nothing loaded, and take the
same sequence of loads and unloads of the ensembles and the models they run
(``unload_dependents`` among them): each answer and the repository index after it are
compared (:data:`CONTROL`); a third pair takes loads with files (``file:``
parameters) and a Python model's ``pb_utils.load_model`` / ``unload_model`` /
``is_model_ready``, and a version reloaded under traffic (answered throughout, as the
index and readiness said meanwhile; then a reload that fails)
(``bench/triton_loading_parity.py``); tritonclient's compressed
requests and answers are compared too (``bench/triton_transport_parity.py``). Custom metric
families a model defines are looked for in both servers' ``/metrics``. Prints one line
per check and a verdict; the exit status is 0 when everything matched, 1 when something
differed, 2 when a server could not be installed or started. Results go to
``bench/results/triton_python_parity.json``.
"""

from __future__ import annotations

import argparse
import json
import queue
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from bench import peers, triton_loading_parity, triton_transport_parity
from bench.common import save, sordino_server

EXAMPLES = Path(__file__).parent.parent / "tests" / "fixtures" / "triton_python_examples"

Case = tuple[str, dict[str, np.ndarray], list[str]]

DECOUPLED = {"repeat_int32", "square_int32", "stream_errors", "iterative_stream"}
"""The decoupled examples: streamed, not asked once."""

OWN = Path(__file__).parent.parent / "tests" / "fixtures" / "triton_python_answers"
"""Models of our own, added to the repository (``tests/backends/test_python_backend.py``
serves them too)."""

ERROR_CODES = "error_codes"
"""It answers ``X = -1 - code`` with ``TritonError(message, code)``, so both servers'
status for each of Triton's error codes, and the message the client reads, can be
compared."""

AS_MADE = "as_made"
"""It returns INT64 and BYTES tensors for outputs its ``config.pbtxt`` declares FP32;
both servers' datatypes and values are compared."""

STREAM_ERRORS = "stream_errors"
"""A decoupled model whose stream carries error responses, with and without the final
flag: both servers' streams are compared as the decoupled examples' are."""

STREAM_ERRORS_BLS = "stream_errors_bls"
"""It calls :data:`STREAM_ERRORS` through BLS (``exec(decoupled=True)``) and answers what
it saw. Triton 2.51 drops the error response within the stream (its BLS iterator yields
the responses around it only); sordino yields it, with ``has_error()``: a known
difference, printed as such and not counted as one (docs/backends.md says why)."""

VERSIONS = "versions"
"""Three version folders and ``version_policy: { specific { versions: [ 1, 3 ] } }``:
which versions each server serves (asked by number, and with none), and what they
answer."""

COLD_START = "cold_start"
"""Its first ``execute`` takes 0.5 s, the rest no time: then asked one request every
0.3 s with a 100 ms ``timeout``, each answered or refused. Triton bounds only the wait in
its queue and answers all; sordino refuses a request its batch time says cannot finish
in time, until that figure is over a second old (``STALE_S``) and an idle model runs
one to measure it again: a known difference while the refusals end within that second
(docs/scheduling.md, "Overload")."""

ENSEMBLES: dict[str, tuple[tuple[str, str], tuple[str, str], bool]] = {
    "ensemble_add_sub": (("A", "B"), ("TWICE_A", "diff"), False),
    "ensemble_batched": (("X", "Y"), ("DOUBLE_X", "SUM"), True),
}
"""Triton ensembles (``platform: "ensemble"``) of the examples ``add_sub`` and
``auto_complete``: ensemble name -> (inputs, outputs, batched). Their tensors are named
apart from the steps' and their steps are wired by those names; one does not batch, the
other takes 1 to 4 rows."""

OPTIONAL = "optional_input"
"""Its input ``BIAS`` is ``optional: true``: asked with and without it (and both at once,
from threads, so they may meet in one batch); sordino refused a request without it
before ("expects input 'BIAS'")."""

OWN_OUTPUTS = "own_outputs"
"""Its responses are not rows of one batch: outputs of variable length, FP32 or INT64
from one request to the next, more rows than the request sent, and a string output of
other objects. Eight requests at once; each answer's outputs (datatype, shape, values)
compared, but for ``BATCH`` (how many requests ``execute`` got: the batchers differ).
sordino failed such a batch and ran it again request by request before, widened the
datatypes (FP32 answered as FP64), and ended its worker on the objects."""

CACHED = "cached"
"""It enables ``response_cache`` and answers how many requests it has run; both servers
start with a local cache of 1 MiB (:data:`CACHE`). Asked the same inputs again over
HTTP and gRPC, with other inputs between: the answers (an answer from the cache says
the run of the request that filled it) and the statistics after (inferences,
executions, successes, cache hits and misses) are compared. sordino refused
``response_cache`` at load before."""

CACHE = "local,size=1048576"
"""Both servers' ``--cache-config``."""

WARMUP = "warmup"
"""Its ``config.pbtxt`` has ``model_warmup`` samples (zeros twice, two rows from a data
file) and it answers what it ran before each request: both servers must have run the
same. sordino refused ``model_warmup`` at load before."""

REQUESTED_ONLY = "requested_only"
"""It answers each request with only the outputs it asked for (of A and B; C is
declared and never returned): three requests asking for different outputs, sent at
once (one batch), must each get theirs; sordino answered a response lacking a declared
output with a 500 before. :data:`REQUESTED_ONLY_ENSEMBLE` runs it as a step."""

REQUESTED_ONLY_ENSEMBLE = "ensemble_requested_only"
"""An ensemble mapping :data:`REQUESTED_ONLY`'s A and C (never returned) to OA and OC:
asked with no outputs named and for OC alone."""

_REQUESTED_ONLY_STEP = (
    '{ model_name: "requested_only" model_version: -1 input_map { key: "X" value: "IN" } '
    'output_map { key: "A" value: "OA" } output_map { key: "C" value: "OC" } }'
)

RESHAPED = "reshaped"
"""Its tensors are reshaped (Triton's ``reshape``): GRID sent as ``[rows, n, 2, 2]`` is
``[rows, n, 4]`` to the model, and its outputs the other way round (one from ``[rows]``
to ``[rows, 1]``); it answers the shape it saw. Asked one at a time and several at once
(one batch); sordino refused the model before ("reshape is not supported")."""

LEVEL_QUEUES = "level_queues"
"""Priority levels with queue policies of their own (``priority_queue_policy``): at most
one request of level 2 waits, one of level 3 waits at most 200 ms; each ``execute``
takes 0.5 s. Five requests sent 0.05 s apart (:data:`_LEVEL_ORDER`) must be answered or
refused alike; sordino refused the model at load before."""

_LEVEL_ORDER = ((1, "A"), (2, "B"), (2, "C"), (3, "E"), (1, "D"))
"""(priority, name) of :data:`LEVEL_QUEUES`'s requests, in the order sent: A runs; B
waits at level 2, whose queue is then full for C; E's 200 ms pass behind A; D waits."""

ORDERED = "ordered"
"""Responses in the order their batches started (``preserve_ordering``): two instances,
each request sleeps X ms. A (600 ms) is sent, then B (10 ms) 0.1 s later, on another
instance: B's answer must come after A's, as on Triton; sordino refused the field before."""

ITERATIVE = "iterative"
"""Triton's iterative sequences: a request asks to be run X times and the model runs it
again in later batches (request rescheduling) until then; four asked at once (X 3, 1,
2, 4: the runs again join new requests' batches) and one alone. sordino refused
``iterative_sequence`` and ``set_release_flags(..._RESCHEDULE)`` before."""

ITERATIVE_STREAM = "iterative_stream"
"""The decoupled form (the python_backend README's example): X responses counting down,
one a run, the last sent with the final flag; streamed as the decoupled examples are."""

ITERATIVE_CONTROLS = "iterative_controls"
"""Iterative sequences with control inputs the model does not declare in ``input`` (a
Python model gets them so from Triton): each run's START, END, READY, CORRID, flags()
and correlation ID, for requests asked one at a time (X 3, 1, then X 2 with a
``sequence_id`` of the client's). sordino refused undeclared control inputs before."""

SLOT_UTILIZATION = "slot_utilization"
"""Triton's ``direct`` sequence strategy waiting for half of its 4 slots (up to 2 s):
one sequence's request alone waits, two sequences' requests sent together run at once,
in one batch. :data:`DIRECT_DELAY`, the same without ``minimum_slot_utilization``, runs
a lone request at once. sordino refused the field before, and waited the delay for a
fuller batch where Triton's direct strategy waits for nothing."""

DIRECT_DELAY = "direct_delay"

QUIET_S = 2.0
"""After an error in a gRPC stream, how long to wait for more before taking the stream
as ended (the client is not told whether the error was the request's last)."""


def _as_made(mod: Any, client: Any) -> list[tuple[str, str, Any]]:
    """(output, datatype, values) of ``as_made``'s answer."""
    tensor = mod.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    result = client.infer(AS_MADE, [tensor])
    found = []
    for name in ("I", "S", "F"):
        output = result.get_output(name)
        datatype = output["datatype"] if isinstance(output, dict) else output.datatype
        found.append((name, datatype, result.as_numpy(name).tolist()))
    return found


def _error_answer(mod: Any, client: Any, code: int) -> tuple[str, str]:
    """(status, message) of the error ``error_codes`` answers for Triton's ``code``."""
    tensor = mod.InferInput("X", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[-1 - code]], dtype=np.int32))
    try:
        client.infer(ERROR_CODES, [tensor])
    except InferenceServerException as error:
        return str(error.status()), str(error.message())
    return "OK", ""


def _seen(mod: Any, client: Any, x: int) -> list[str]:
    """What :data:`STREAM_ERRORS_BLS` saw of ``stream_errors``'s stream for ``x``."""
    tensor = mod.InferInput("X", [1], "INT32")
    tensor.set_data_from_numpy(np.array([x], dtype=np.int32))
    result = client.infer(STREAM_ERRORS_BLS, [tensor])
    return [s.decode() for s in result.as_numpy("SEEN").tolist()]


def _versions(mod: Any, client: Any) -> list[tuple[str, Any]]:
    """(version asked, the answer's V or "refused") for :data:`VERSIONS`."""
    found: list[tuple[str, Any]] = []
    for version in ("", "1", "2", "3"):
        tensor = mod.InferInput("X", [1], "INT32")
        tensor.set_data_from_numpy(np.array([7], dtype=np.int32))
        try:
            result = client.infer(VERSIONS, [tensor], model_version=version)
        except InferenceServerException:
            found.append((version, "refused"))
            continue
        found.append((version, result.as_numpy("V").tolist()))
    return found


def _cold(mod: Any, client: Any) -> list[str]:
    """What each of 8 requests to :data:`COLD_START` got ("ok" or the status), one every
    0.3 s, all but the first with a 100 ms timeout."""
    found = []
    for i in range(8):
        time.sleep(0.3 if i else 0.0)
        tensor = mod.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[i]], dtype=np.int32))
        try:
            client.infer(COLD_START, [tensor], **({"timeout": 100_000} if i else {}))
            found.append("ok")
        except InferenceServerException as error:
            found.append(str(error.status()))
    return found


def stream_cases(models: list[str]) -> list[tuple[str, dict[str, np.ndarray]]]:
    """(model, inputs) for the decoupled examples among ``models`` (Triton's clients' own
    requests, an empty one, and a few more)."""
    out: list[tuple[str, dict[str, np.ndarray]]] = []
    if "repeat_int32" in models:
        for values, delays, wait in (([4, 2, 0, 1], [1, 2, 3, 4], 5), ([], [], 0), ([9], [0], 1)):
            out.append(
                (
                    "repeat_int32",
                    {
                        "IN": np.array(values, np.int32),
                        "DELAY": np.array(delays, np.uint32),
                        "WAIT": np.array([wait], np.uint32),
                    },
                )
            )
    if "square_int32" in models:
        out += [("square_int32", {"IN": np.array([n], np.int32)}) for n in (4, 0, 1)]
    if STREAM_ERRORS in models:
        out += [(STREAM_ERRORS, {"X": np.array([n], np.int32)}) for n in (0, 3, -1)]
    if ITERATIVE_STREAM in models:
        out += [(ITERATIVE_STREAM, {"IN": np.array([[n]], np.int32)}) for n in (3, 1)]
    return out


def _stream(address: str, model: str, arrays: dict[str, np.ndarray]) -> list[Any]:
    """Every response to one request over ``ModelStreamInfer``: (outputs, final) pairs."""
    client = grpcclient.InferenceServerClient(address)
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    inputs = []
    for name, array in arrays.items():
        datatype = "INT32" if array.dtype == np.int32 else "UINT32"
        tensor = grpcclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    client.async_stream_infer(model, inputs, request_id="1", enable_empty_final_response=True)
    got: list[Any] = []
    try:
        while True:
            try:
                result, error = answers.get(
                    timeout=QUIET_S if got and got[-1][0] == "error" else 30
                )
            except queue.Empty:
                if got and got[-1][0] == "error":
                    break  # an error was the request's last response
                raise
            if error is not None:
                got.append(("error", str(error)))
                continue
            response = result.get_response()
            outputs = {o.name: result.as_numpy(o.name).tolist() for o in response.outputs}
            final = response.parameters["triton_final_response"].bool_param
            got.append((outputs, final))
            if final:
                break
    finally:
        client.stop_stream()
        client.close()
    return got


def _sse(url: str, model: str, arrays: dict[str, np.ndarray]) -> list[Any]:
    """Every event of ``generate_stream`` for one request (JSON, as sent)."""
    body = json.dumps({name: array.tolist() for name, array in arrays.items()}).encode()
    request = urllib.request.Request(
        f"{url}/v2/models/{model}/generate_stream", data=body, method="POST"
    )
    events = []
    with urllib.request.urlopen(request, timeout=30) as response:
        for line in response:
            if line.startswith(b"data:"):
                events.append(json.loads(line[len(b"data:") :]))
    return events


def _refuses_infer(client: Any, mod: Any, model: str, arrays: dict[str, np.ndarray]) -> bool:
    inputs = []
    for name, array in arrays.items():
        tensor = mod.InferInput(
            name, list(array.shape), "INT32" if array.dtype == np.int32 else "UINT32"
        )
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    try:
        client.infer(model, inputs)
    except Exception:
        return True
    return False


def cases(models: list[str]) -> list[Case]:
    """(model, inputs, outputs) for the add_sub-shaped example ``models``.

    A model whose name says ``auto_complete`` gets batched requests (1 to 4 rows);
    ``bls_sync`` (Triton's bls example) also gets ``MODEL_NAME``, the model it calls.
    """
    rng = np.random.default_rng(29)
    out: list[Case] = []
    for _ in range(3):
        for model in models:
            if model == OPTIONAL:
                rows = int(rng.integers(1, 5))
                x, bias = (rng.standard_normal((rows, 4)).astype(np.float32) for _ in range(2))
                out.append((model, {"X": x, "BIAS": bias}, ["Y"]))
                out.append((model, {"X": x}, ["Y"]))
                continue
            if model == RESHAPED:
                shape = (int(rng.integers(1, 4)), int(rng.integers(1, 4)), 2, 2)
                grid = rng.standard_normal(shape).astype(np.float32)
                out.append((model, {"GRID": grid}, ["TWICE", "TOTAL", "SEEN"]))
                continue
            if model in ENSEMBLES:
                names, outputs, batched = ENSEMBLES[model]
                shape = (int(rng.integers(1, 5)), 4) if batched else (4,)
                ensemble = {n: rng.standard_normal(shape).astype(np.float32) for n in names}
                out.append((model, ensemble, list(outputs)))
                continue
            shape = (int(rng.integers(1, 5)), 4) if "auto_complete" in model else (4,)
            a, b = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
            arrays = {"INPUT0": a, "INPUT1": b}
            if model == "bls_sync":
                arrays["MODEL_NAME"] = np.array([b"add_sub"], dtype=np.object_)
            out.append((model, arrays, ["OUTPUT0", "OUTPUT1"]))
    return out


def _tensors(mod: Any, arrays: dict[str, np.ndarray]) -> list[Any]:
    inputs = []
    for name, array in arrays.items():
        datatype = "BYTES" if array.dtype == np.object_ else np_to_triton_dtype(array.dtype)
        tensor = mod.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _asked(mod: Any, outputs: list[str]) -> list[Any]:
    return [mod.InferRequestedOutput(n) for n in outputs]


def _infer(mod: Any, client: Any, case: Case) -> dict[str, np.ndarray]:
    model, arrays, outputs = case
    result = client.infer(model, _tensors(mod, arrays), outputs=_asked(mod, outputs))
    return {name: result.as_numpy(name) for name in outputs}


def _listed(answers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each answer's outputs as lists (None: the output is not in the answer)."""
    return [{n: None if a is None else a.tolist() for n, a in answer.items()} for answer in answers]


def _at_once(mod: Any, url: str, asked: list[Case]) -> list[dict[str, np.ndarray]]:
    """Every case sent at once: by the HTTP client's ``async_infer`` (one client that
    many wide, from this thread: it is gevent's), or each from a thread over gRPC."""
    if mod is httpclient:
        client = httpclient.InferenceServerClient(
            url=url.removeprefix("http://"), concurrency=len(asked)
        )
        pending = [
            client.async_infer(model, _tensors(mod, arrays), outputs=_asked(mod, outputs))
            for model, arrays, outputs in asked
        ]
        results = [request.get_result() for request in pending]
        answers = [
            {n: r.as_numpy(n) for n in outputs}
            for r, (_, _, outputs) in zip(results, asked, strict=True)
        ]
    else:
        client = grpcclient.InferenceServerClient(url)
        with ThreadPoolExecutor(len(asked)) as pool:
            answers = list(pool.map(partial(_infer, mod, client), asked))
    client.close()
    return answers


CONFIGURED = ("add_sub", "auto_complete", CACHED, OPTIONAL, WARMUP, REQUESTED_ONLY,
              RESHAPED, LEVEL_QUEUES, ORDERED, *ENSEMBLES, REQUESTED_ONLY_ENSEMBLE,
              ITERATIVE, ITERATIVE_STREAM, ITERATIVE_CONTROLS)  # fmt: skip
"""Models whose whole configuration (HTTP) is compared, as :func:`_config` keeps it:
Python models and ensembles (their steps as written)."""


SEQUENCED = (ITERATIVE, ITERATIVE_STREAM, ITERATIVE_CONTROLS)
"""Models whose ``sequence_batching`` section is compared over gRPC too."""


def _config(client: Any, model: str) -> dict[str, Any]:
    """A model's configuration (HTTP), every field in Triton's order, less what differs on
    purpose: sordino's own ``sordino_*`` parameters, the scheduler's values in
    ``dynamic_batching`` (its priority levels and preferred sizes are the ones it uses;
    the delay, the ordering and the levels' own queue policies are compared)."""
    config = client.get_model_config(model)
    config["parameters"] = {
        k: v for k, v in config.get("parameters", {}).items() if not k.startswith("sordino_")
    }
    batching = config.get("dynamic_batching")
    if batching is not None:
        config["dynamic_batching"] = {
            k: batching.get(k)
            for k in ("max_queue_delay_microseconds", "preserve_ordering", "priority_queue_policy")
        }
    return {"keys": list(config), **config}


def _metadata(mod: Any, client: Any, model: str) -> list[tuple[str, str, str, list[int]]]:
    meta = client.get_model_metadata(model)
    if mod is grpcclient:
        rows = [("input", t.name, t.datatype, list(t.shape)) for t in meta.inputs]
        rows += [("output", t.name, t.datatype, list(t.shape)) for t in meta.outputs]
    else:
        rows = [("input", t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]]
        rows += [("output", t["name"], t["datatype"], t["shape"]) for t in meta["outputs"]]
    return [(kind, name, dtype, [int(d) for d in shape]) for kind, name, dtype, shape in rows]


def _clients(http: str, grpc: str) -> list[tuple[str, Any, Any]]:
    return [
        ("http", httpclient, httpclient.InferenceServerClient(url=http.removeprefix("http://"))),
        ("grpc", grpcclient, grpcclient.InferenceServerClient(grpc)),
    ]


COUNTED = ("nv_inference_request_success", "nv_inference_request_failure",
           "nv_inference_count", "nv_inference_exec_count")  # fmt: skip
"""Triton's counters whose values both servers should agree on for a model asked the
same requests one at a time (durations differ; batching may, under concurrency)."""


def _nv_samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    # The parser names a counter's samples NAME_total; Triton's carry no suffix, and
    # sordino's (untyped) neither: compare the names as written.
    return {
        (sample.name.removesuffix("_total"), tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("nv_")
        for sample in family.samples
    }


def _triton_metrics(theirs: str, ours: str, models: list[str]) -> list[dict[str, Any]]:
    """Triton's ``nv_inference_*`` families in both servers' ``/metrics``, and the
    counts of the models asked one request at a time (:data:`ERROR_CODES`, add_sub)."""
    expected, got = _nv_samples(theirs), _nv_samples(ours)
    checks = []
    wanted = {name for name, _ in expected if name.startswith("nv_inference")}
    missing = sorted(wanted - {name for name, _ in got})
    detail = f"missing {missing}" if missing else ""
    checks.append({"check": "/metrics has Triton's nv_inference_* families", "protocol": "http",
                   "equal": not missing, "detail": detail})  # fmt: skip
    if CACHED in models:  # the response cache's families, and the cached model's counts
        cache = {name for name, _ in expected if name.startswith("nv_cache")}
        missing = sorted(cache - {name for name, _ in got})
        checks.append(
            {
                "check": "/metrics has Triton's nv_cache_* families",
                "protocol": "http",
                "equal": bool(cache) and not missing,
                "detail": f"missing {missing}" if missing else f"{len(cache)} families",
            }
        )
        counted = {"nv_cache_num_hits_per_model", "nv_cache_num_misses_per_model"}
        pick = (
            {k: v for k, v in expected.items() if k[0] in counted},
            {k: v for k, v in got.items() if k[0] in counted},
        )
        checks.append({"check": f"{CACHED} nv_cache counts", "protocol": "http",
                       "equal": pick[0] == pick[1],
                       "detail": f"triton {pick[0]}, sordino {pick[1]}"})  # fmt: skip
    for model in (m for m in (ERROR_CODES, "add_sub") if m in models):
        theirs_counts = {k: v for k, v in expected.items() if k[0] in COUNTED
                         and ("model", model) in k[1]}  # fmt: skip
        ours_counts = {k: v for k, v in got.items() if k[0] in COUNTED and ("model", model) in k[1]}
        shown = {f"{k[0]}{dict(k[1]).get('reason', '')}": v for k, v in sorted(ours_counts.items())}
        same = theirs_counts == ours_counts
        detail = str(shown) if same else f"triton {theirs_counts}, sordino {ours_counts}"
        checks.append({"check": f"{model} nv_inference counts", "protocol": "http",
                       "equal": same, "detail": detail})  # fmt: skip
    for check in checks:
        print(f"{'ok  ' if check['equal'] else 'DIFF'} http {check['check']} {check['detail']}")
    return checks


def _metric_names(url: str) -> set[str]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line[:1].isalpha()}


def compare(
    triton: peers.Server, sordino_http: str, sordino_grpc: str, models: list[str]
) -> list[dict[str, Any]]:
    """Send every case to both servers over both protocols; one record per check."""
    checks: list[dict[str, Any]] = []

    def check(what: str, protocol: str, same: bool, detail: str = "", known: bool = False) -> None:
        checks.append(
            {"check": what, "protocol": protocol, "equal": same, "detail": detail, "known": known}
        )
        print(f"{'ok  ' if same else 'KNOWN' if known else 'DIFF'} {protocol:4} {what} {detail}")

    ends = (_clients(triton.http, triton.grpc or ""), _clients(sordino_http, sordino_grpc))
    pairs = zip(*ends, strict=True)
    for (protocol, mod, theirs), (_, _, ours) in pairs:
        for model in models:
            check(
                f"{model} metadata",
                protocol,
                _metadata(mod, theirs, model) == _metadata(mod, ours, model),
            )
        for model, arrays in stream_cases(models):
            shown = {n: a.tolist() for n, a in arrays.items()}
            if protocol == "grpc":
                expected, got = (
                    _stream(triton.grpc or "", model, arrays),
                    _stream(sordino_grpc, model, arrays),
                )
                check(f"{model} stream {shown}", protocol, expected == got, f"{len(got)} responses")
            else:
                expected, got = _sse(triton.http, model, arrays), _sse(sordino_http, model, arrays)
                check(f"{model} generate_stream {shown}", protocol, expected == got,
                      f"{len(got)} events")  # fmt: skip
            refused = (_refuses_infer(theirs, mod, model, arrays),
                       _refuses_infer(ours, mod, model, arrays))  # fmt: skip
            check(f"{model} unary infer refused", protocol, refused == (True, True), str(refused))
        own = {ERROR_CODES, AS_MADE, STREAM_ERRORS_BLS, VERSIONS, COLD_START, WARMUP, CACHED,
               REQUESTED_ONLY, REQUESTED_ONLY_ENSEMBLE, LEVEL_QUEUES, ORDERED,
               ITERATIVE, ITERATIVE_CONTROLS, SLOT_UTILIZATION, DIRECT_DELAY,
               OWN_OUTPUTS}  # fmt: skip
        if WARMUP in models:  # asked first, over each protocol in turn: the same history
            ones: Case = (WARMUP, {"X": np.ones((1, 4), np.float32)}, ["CALLS", "ROWS", "TOTAL"])
            expected_run, got_run = _infer(mod, theirs, ones), _infer(mod, ours, ones)
            shown = {n: a.ravel().tolist() for n, a in got_run.items()}
            same = all(np.array_equal(expected_run[n], got_run[n]) for n in expected_run)
            check(f"{WARMUP} ran its samples", protocol, same, str(shown))
        for case in cases([m for m in models if m not in DECOUPLED and m not in own]):
            expected, got = _infer(mod, theirs, case), _infer(mod, ours, case)
            same = all(np.array_equal(expected[n], got[n]) for n in expected)
            shapes = {n: list(got[n].shape) for n in got}
            check(f"{case[0]} infer", protocol, same, str(shapes))
        if "bls_sync" in models:  # Triton's bls client: a call to an undefined model fails
            a = np.zeros(4, dtype=np.float32)
            case: Case = (
                "bls_sync",
                {"INPUT0": a, "INPUT1": a, "MODEL_NAME": np.array([b"undefined_model"], object)},
                ["OUTPUT0"],
            )
            refused = [_refuses(mod, client, case) for client in (theirs, ours)]
            check("bls_sync undefined_model refused", protocol, all(refused), str(refused))
        # Each server's address for this protocol, for the checks with clients of their own.
        http = protocol == "http"
        urls = (triton.http, sordino_http) if http else (triton.grpc or "", sordino_grpc)
        if OPTIONAL in models:  # with and without BIAS at once: one batch may hold both
            mixed = cases([OPTIONAL])
            expected_mixed, got_mixed = (_at_once(mod, url, mixed) for url in urls)
            same = all(
                np.array_equal(e["Y"], g["Y"])
                for e, g in zip(expected_mixed, got_mixed, strict=True)
            )
            check(
                f"{OPTIONAL} with and without BIAS at once",
                protocol,
                same,
                f"{len(mixed)} requests",
            )
        if OWN_OUTPUTS in models:  # eight at once, each answer's tensors as its response's
            expected_own, got_own = (_own_outputs(mod, url) for url in urls)
            check(f"{OWN_OUTPUTS} each its own tensors, at once", protocol,
                  expected_own == got_own, str(got_own[-1]))  # fmt: skip
        if REQUESTED_ONLY in models:  # one batch of three, each asking for other outputs
            asked = [(REQUESTED_ONLY, {"X": np.array([[v]], np.int32)}, names)
                     for v, names in ((1, ["A"]), (2, ["B"]), (3, ["A", "B", "C"]))]  # fmt: skip
            expected_only, got_only = (_listed(_at_once(mod, url, asked)) for url in urls)
            check(f"{REQUESTED_ONLY} each its outputs, at once", protocol,
                  expected_only == got_only, str(got_only))  # fmt: skip
        if RESHAPED in models:  # several shapes at once: one batch of rows alike
            together: list[Case] = [
                (RESHAPED, {"GRID": np.full((rows, 2, 2, 2), rows, np.float32)},
                 ["TWICE", "TOTAL", "SEEN"])
                for rows in (1, 2, 3)
            ]  # fmt: skip
            expected_shaped, got_shaped = (_listed(_at_once(mod, url, together)) for url in urls)
            check(f"{RESHAPED} at once", protocol, expected_shaped == got_shaped,
                  f"{len(together)} requests")  # fmt: skip
        if ORDERED in models:
            expected_order, got_order = (_ordered(mod, url) for url in urls)
            check(f"{ORDERED} answered in order", protocol, expected_order == got_order,
                  f"triton {expected_order}, sordino {got_order}")  # fmt: skip
        if ITERATIVE in models:
            expected_runs, got_runs = (_iterative(mod, url) for url in urls)
            check(f"{ITERATIVE} runs again", protocol, expected_runs == got_runs,
                  f"triton {expected_runs}, sordino {got_runs}")  # fmt: skip
        if ITERATIVE_CONTROLS in models:
            expected_seen, got_seen = (_iterative_controls(mod, c) for c in (theirs, ours))
            check(f"{ITERATIVE_CONTROLS} each run's controls", protocol,
                  expected_seen == got_seen,
                  f"triton {expected_seen}, sordino {got_seen}")  # fmt: skip
        for model, together in ((SLOT_UTILIZATION, 1), (SLOT_UTILIZATION, 2), (DIRECT_DELAY, 1)):
            if model in models:  # (three lone requests in turn: sordino's predictive batcher
                # ran the first at once and waited the delay for a later one before)
                rounds = 3 if model == DIRECT_DELAY else 1
                expected_slots, got_slots = (
                    [_slots(mod, url, model, together) for _ in range(rounds)] for url in urls
                )
                check(f"{model} {together} sequence(s) at once", protocol,
                      expected_slots == got_slots,
                      f"triton {expected_slots}, sordino {got_slots}")  # fmt: skip
        if LEVEL_QUEUES in models:
            expected_levels, got_levels = (_level_queues(mod, url) for url in urls)
            check(f"{LEVEL_QUEUES} answered or refused", protocol,
                  expected_levels == got_levels,
                  f"triton {expected_levels}, sordino {got_levels}")  # fmt: skip
        if REQUESTED_ONLY_ENSEMBLE in models:
            for names in (["OA", "OC"], ["OC"]):
                case = (REQUESTED_ONLY_ENSEMBLE, {"IN": np.array([[3]], np.int32)}, names)
                expected_step, got_step = (_listed([_infer(mod, c, case)]) for c in (theirs, ours))
                check(f"{REQUESTED_ONLY_ENSEMBLE} asked {names}", protocol,
                      expected_step == got_step, str(got_step))  # fmt: skip
        for model in CONFIGURED if protocol == "http" else ():
            if model in models:
                expected_config, got_config = _config(theirs, model), _config(ours, model)
                differing = sorted(k for k in expected_config
                                   if expected_config[k] != got_config.get(k))  # fmt: skip
                check(f"{model} config", protocol, not differing and expected_config == got_config,
                      ", ".join(f"{k}: triton {expected_config[k]}, sordino {got_config.get(k)}"
                                for k in differing))  # fmt: skip
        for model in SEQUENCED if protocol == "grpc" else ():
            if model in models:  # the gRPC form (HTTP's is among the whole configurations)
                expected_section, got_section = (
                    c.get_model_config(model, as_json=True)["config"].get("sequence_batching")
                    for c in (theirs, ours)
                )
                check(f"{model} sequence_batching", protocol, expected_section == got_section,
                      str(got_section))  # fmt: skip
        if CACHED in models:
            expected_runs, got_runs = _cached(mod, theirs), _cached(mod, ours)
            check(f"{CACHED} answers", protocol, expected_runs == got_runs, str(got_runs))
        if CACHED in models and protocol == "grpc":  # after both protocols' requests
            expected_stats, got_stats = _cache_stats(theirs), _cache_stats(ours)
            check(f"{CACHED} statistics", protocol, expected_stats == got_stats,
                  f"triton {expected_stats}, sordino {got_stats}")  # fmt: skip
        if AS_MADE in models:
            expected_made, got_made = _as_made(mod, theirs), _as_made(mod, ours)
            check(f"{AS_MADE} datatypes", protocol, expected_made == got_made, str(got_made))
        if COLD_START in models:
            expected_cold, got_cold = _cold(mod, theirs), _cold(mod, ours)
            refused = next((i for i, a in enumerate(got_cold[1:], 1) if a == "ok"), 8) - 1
            check(f"{COLD_START} then 100 ms timeouts", protocol, expected_cold == got_cold,
                  f"triton {expected_cold}, sordino {got_cold}",
                  known=got_cold == ["ok"] + [got_cold[1]] * refused + ["ok"] * (7 - refused)
                  and refused <= 4)  # fmt: skip
        if VERSIONS in models:
            expected_versions, got_versions = _versions(mod, theirs), _versions(mod, ours)
            check(f"{VERSIONS} served", protocol, expected_versions == got_versions,
                  str(got_versions))  # fmt: skip
        if STREAM_ERRORS_BLS in models:
            for x in (0, 3):  # with the final flag on the error, Triton's caller waits forever
                expected_seen, got_seen = _seen(mod, theirs, x), _seen(mod, ours, x)
                detail = f"triton {expected_seen}, sordino {got_seen}"
                but_errors = [s for s in got_seen if not s.startswith("error")]
                check(f"{STREAM_ERRORS_BLS} X={x}", protocol, expected_seen == got_seen, detail,
                      known=expected_seen == but_errors)  # fmt: skip
        if ERROR_CODES in models:
            for code in range(8):
                expected, got = _error_answer(mod, theirs, code), _error_answer(mod, ours, code)
                check(f"{ERROR_CODES} error code {code}", protocol, expected == got, str(got))
        theirs.close()
        ours.close()
    return checks


def _level_queues(mod: Any, url: str) -> list[str]:
    """Each of :data:`_LEVEL_ORDER`'s requests' fate: ``ok`` or ``refused``, in order."""

    def one(index: int, priority: int) -> str:
        time.sleep(0.05 * index)
        if mod is httpclient:  # (tritonclient's HTTP client is gevent's: one a thread)
            body = {
                "inputs": [{"name": "X", "shape": [1, 1], "datatype": "INT32", "data": [index]}],
                "parameters": {"priority": priority},
            }
            request = urllib.request.Request(
                f"{url}/v2/models/{LEVEL_QUEUES}/infer", json.dumps(body).encode(),
                {"Content-Type": "application/json"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=30) as answer:
                    answer.read()
            except urllib.error.HTTPError:
                return "refused"
            return "ok"
        client = grpcclient.InferenceServerClient(url)
        tensor = grpcclient.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[index]], np.int32))
        try:
            client.infer(LEVEL_QUEUES, [tensor], priority=priority)
        except InferenceServerException:
            return "refused"
        finally:
            client.close()
        return "ok"

    with ThreadPoolExecutor(len(_LEVEL_ORDER)) as pool:
        fates = pool.map(lambda at: one(at[0], at[1][0]), enumerate(_LEVEL_ORDER))
        return [f"{name} {fate}" for (_, name), fate in zip(_LEVEL_ORDER, fates, strict=True)]


def _ordered(mod: Any, url: str) -> str:
    """:data:`ORDERED`'s requests A (600 ms) and B (10 ms, sent 0.1 s after A): whether
    B's answer came before A's, or with it (held: the two answers' own order is then
    this client's threads')."""
    done: dict[str, float] = {}

    def ask(name: str, ms: int) -> None:
        client = mod.InferenceServerClient(url.removeprefix("http://"))
        tensor = mod.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[ms]], np.int32))
        client.infer(ORDERED, [tensor])
        done[name] = time.monotonic()
        client.close()

    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(ask, "A", 600)
        time.sleep(0.1)
        second = pool.submit(ask, "B", 10)
        first.result(), second.result()
    return "B before A" if done["B"] < done["A"] - 0.2 else "B with or after A"


def _iterative(mod: Any, url: str) -> list[Any]:
    """:data:`ITERATIVE`'s answers (runs, X, the last run's flags) to four requests at
    once (X 3, 1, 2, 4), then to one alone (X 2)."""

    def ask(x: int) -> Any:
        client = mod.InferenceServerClient(url.removeprefix("http://"))
        tensor = mod.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[x]], np.int32))
        try:
            return client.infer(ITERATIVE, [tensor]).as_numpy("Y").tolist()
        except InferenceServerException as error:
            return f"error {error.status()}: {error.message()}"
        finally:
            client.close()

    with ThreadPoolExecutor(4) as pool:
        together = list(pool.map(ask, (3, 1, 2, 4)))
    return [*together, ask(2)]


def _iterative_controls(mod: Any, client: Any) -> list[Any]:
    """:data:`ITERATIVE_CONTROLS`'s answers: X 3 and 1 without a sequence, X 2 with one."""
    answers = []
    for x, options in ((3, {}), (1, {}), (2, {"sequence_id": 9, "sequence_start": True})):
        tensor = mod.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[x]], np.int32))
        answers.append(client.infer(ITERATIVE_CONTROLS, [tensor], **options).as_numpy("Y").tolist())
    return answers


def _slots(mod: Any, url: str, model: str, together: int) -> list[tuple[int, str]]:
    """``together`` sequences' one request each (start and end), sent at once: each one's
    batch size, and whether it waited (answered after 1 s) or ran at once."""

    def ask(corrid: int) -> tuple[int, str]:
        client = mod.InferenceServerClient(url.removeprefix("http://"))
        tensor = mod.InferInput("X", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[corrid]], np.int32))
        started = time.monotonic()
        answer = client.infer(
            model, [tensor], sequence_id=corrid, sequence_start=True, sequence_end=True
        )
        took = time.monotonic() - started
        client.close()
        return int(answer.as_numpy("BATCH")[0, 0]), "waited" if took > 1.0 else "at once"

    with ThreadPoolExecutor(together) as pool:
        return sorted(pool.map(ask, [100 * together + i for i in range(together)]))


def _cached(mod: Any, client: Any) -> list[tuple[list[float], int]]:
    """:data:`CACHED` asked X, X, another X, X: each answer's Y and RUNS."""
    seen = []
    for first in (1.0, 1.0, 5.0, 1.0):
        x = np.array([first, 2, 3, 4], np.float32)
        answer = _infer(mod, client, (CACHED, {"X": x}, ["Y", "RUNS"]))
        seen.append((answer["Y"].tolist(), int(answer["RUNS"][0])))
    return seen


def _cache_stats(client: Any) -> dict[str, int]:
    """:data:`CACHED`'s statistics that the response cache changes."""
    found = client.get_inference_statistics(CACHED, as_json=True)["model_stats"][0]
    figures = found["inference_stats"]
    return {
        "inference_count": int(found.get("inference_count", 0)),
        "execution_count": int(found.get("execution_count", 0)),
        **{
            key: int(figures.get(key, {}).get("count", 0))
            for key in ("success", "cache_hit", "cache_miss")
        },
    }


def _refuses(mod: Any, client: Any, case: Case) -> bool:
    try:
        _infer(mod, client, case)
    except InferenceServerException:
        return True
    return False


def _own_outputs(mod: Any, url: str) -> list[list[tuple[str, str, list[int], Any]]]:
    """:data:`OWN_OUTPUTS`'s eight requests at once: each answer's outputs but ``BATCH``,
    as (name, datatype, shape, values)."""
    names = ["SEQ", "VAL", "ROWS", "NOTE"]
    asked: list[Case] = [
        (OWN_OUTPUTS, {"X": np.array([[length, length % 2, 2 * (length % 2)]], np.float32)},
         names)
        for length in range(1, 9)
    ]  # fmt: skip
    return [
        [(n, str(a.dtype), list(a.shape), a.tolist()) for n, a in answer.items()]
        for answer in _at_once(mod, url, asked)
    ]


def repository(source: Path, into: Path) -> Path:
    """A copy of ``source`` in ``into``, with the stand-in for the "pytorch" model that
    Triton's bls example calls (add_sub under that name: no torch here) when
    ``bls_async`` is there without it, and the bench's :data:`ERROR_CODES`,
    :data:`AS_MADE`, :data:`STREAM_ERRORS`, :data:`STREAM_ERRORS_BLS`, :data:`VERSIONS`,
    :data:`COLD_START`, :data:`OPTIONAL`, :data:`WARMUP`, :data:`CACHED`, :data:`RESHAPED`,
    :data:`LEVEL_QUEUES`, :data:`ORDERED`, :data:`ITERATIVE`, :data:`ITERATIVE_STREAM`,
    :data:`ITERATIVE_CONTROLS`, :data:`SLOT_UTILIZATION`, :data:`DIRECT_DELAY`,
    :data:`OWN_OUTPUTS` and :data:`REQUESTED_ONLY` models (and
    :data:`REQUESTED_ONLY_ENSEMBLE`), with its :data:`ENSEMBLES` where their steps are."""
    repo = into / "models"
    shutil.copytree(source, repo)
    if (repo / "bls_async").is_dir() and not (repo / "pytorch").exists():
        shutil.copytree(repo / "add_sub", repo / "pytorch")
        config = repo / "pytorch" / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "add_sub"', 'name: "pytorch"'))
    own = (ERROR_CODES, AS_MADE, STREAM_ERRORS, STREAM_ERRORS_BLS, VERSIONS, COLD_START,
           OPTIONAL, WARMUP, CACHED, REQUESTED_ONLY, RESHAPED, LEVEL_QUEUES,
           ORDERED, ITERATIVE, ITERATIVE_STREAM, ITERATIVE_CONTROLS, SLOT_UTILIZATION,
           DIRECT_DELAY, OWN_OUTPUTS)  # fmt: skip
    for name in own:
        shutil.copytree(OWN / name, repo / name)
    (repo / REQUESTED_ONLY_ENSEMBLE / "1").mkdir(parents=True)
    (repo / REQUESTED_ONLY_ENSEMBLE / "config.pbtxt").write_text(
        'platform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
        'output [ { name: "OA", data_type: TYPE_INT32, dims: [ 1 ] },\n'
        '         { name: "OC", data_type: TYPE_INT32, dims: [ 1 ] } ]\n'
        f"ensemble_scheduling {{ step [ {_REQUESTED_ONLY_STEP} ] }}\n"
    )
    if (repo / "add_sub").is_dir() and (repo / "auto_complete").is_dir():
        for name in ENSEMBLES:
            shutil.copytree(OWN / name, repo / name)
    return repo


CONTROL: list[tuple[str, str, dict[str, Any]]] = [
    ("load", "ensemble_add_sub", {}),
    ("unload", "add_sub", {}),
    ("load", "add_sub", {}),
    ("unload", "ensemble_add_sub", {}),
    ("load", "ensemble_add_sub", {}),
    ("load", "ensemble_add_sub", {}),
    ("unload", "ensemble_add_sub", {"unload_dependents": True}),
    ("unload", "add_sub", {}),
    ("load", "ensemble_add_sub", {}),
    ("unload", "ensemble_add_sub", {"unload_dependents": True}),
    ("load", "ensemble_batched", {}),
    ("unload", "auto_complete", {}),
    ("load", "ensemble_batched", {}),
    ("unload", "ensemble_batched", {"unload_dependents": True}),
]
"""Model control of the ensembles, in order: (action, model, parameters)."""


def _control_post(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            text = answer.read()
            return answer.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        return exc.code, None


def _settled_index(url: str, names: set[str]) -> list[tuple[str, str, str]]:
    """The index entries of ``names`` once no model is LOADING or UNLOADING (Triton
    answers an unload before the model has left)."""
    for _ in range(100):
        _, entries = _control_post(f"{url}/v2/repository/index", {})
        found = [(e["name"], e.get("version", ""), e.get("state", "")) for e in entries
                 if e["name"] in names]  # fmt: skip
        if not any(state in ("LOADING", "UNLOADING") for _, _, state in found):
            return sorted(found)
        time.sleep(0.1)
    return sorted(found)


def control_run(url: str) -> list[Any]:
    """Take :data:`CONTROL` on the server at ``url``: the index first, then each
    answer's status and the index after it."""
    names = {model for _, model, _ in CONTROL}
    seen: list[Any] = [_settled_index(url, names)]
    for action, model, parameters in CONTROL:
        body = {"parameters": parameters} if parameters else {}
        status, _ = _control_post(f"{url}/v2/repository/models/{model}/{action}", body)
        seen.append((status, _settled_index(url, names)))
    return seen


def logging_checks(theirs: str, ours: str) -> list[dict[str, Any]]:
    """Triton's logging extension on both servers: the settings' names, a change of
    two, and a change of ``log_file`` refused (the values read first differ by design:
    the bench starts sordino with ``--log-level warning``)."""

    def ask(url: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        if body is None:
            with urllib.request.urlopen(f"{url}/v2/logging", timeout=10) as answer:
                return answer.status, json.loads(answer.read())
        return _control_post(f"{url}/v2/logging", body)

    checks = []
    for what, body in (
        ("names", None),
        ("change", {"log_verbose_level": 1, "log_format": "ISO8601"}),
        ("log_file refused", {"log_file": "/tmp/sordino-parity.log"}),
        ("back", {"log_verbose_level": 0, "log_format": "default"}),
    ):
        (a_status, a), (b_status, b) = ask(theirs, body), ask(ours, body)
        if what == "names":
            same = a_status == b_status == 200 and sorted(a) == sorted(b)
        elif what == "log_file refused":
            same = a_status >= 400 and b_status >= 400
        else:
            same = a_status == b_status == 200 and all(a[k] == b[k] for k in body or {})
        detail = "" if same else f"triton {a_status} {a}, sordino {b_status} {b}"
        checks.append({"check": f"logging {what}", "protocol": "http", "equal": same,
                       "detail": detail})  # fmt: skip
        print(f"{'ok  ' if same else 'DIFF'} http logging {what}")
    return checks


TRACE_STEPS: list[tuple[str, str, dict[str, Any] | None]] = [
    ("read", "", None),
    ("a model's own rate", "add_sub", {"trace_rate": "2"}),
    (
        "switched on",
        "",
        {
            "trace_level": ["TIMESTAMPS"],
            "trace_rate": "1",
            "trace_count": "2",
            "log_frequency": "1",
        },
    ),
    ("the model's, after", "add_sub", None),
    ("the model's rate cleared", "add_sub", {"trace_rate": None}),
    ("rate 0 refused", "", {"trace_rate": "0"}),
    ("file refused", "", {"trace_file": "/tmp/elsewhere.json"}),
    ("unknown model refused", "nope", {"trace_rate": "1"}),
]
"""Triton's trace extension, asked the same of both servers (started with a trace file
and no tracing): each answer's status and settings (the file's path aside) compared."""


def trace_checks(theirs: str, ours: str) -> list[dict[str, Any]]:
    """:data:`TRACE_STEPS` on both servers, then two add_sub requests (``t0``, ``t1``:
    both traced, rate 1 and count 2, a file each) and the settings after (count ``"0"``
    on both)."""

    def ask(url: str, model: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        where = f"{url}/v2{f'/models/{model}' if model else ''}/trace/setting"
        if body is None:
            with urllib.request.urlopen(where, timeout=10) as answer:
                found = json.loads(answer.read())
                status = answer.status
        else:
            status, found = _control_post(where, body)
        if isinstance(found, dict):
            found.pop("trace_file", None)
        return status, found if status < 400 else None

    checks = []
    a_add_sub = np.ones(4, np.float32)
    for what, model, body in [*TRACE_STEPS, ("after two requests", "", None)]:
        if what == "after two requests":
            for url in (theirs, ours):
                client = httpclient.InferenceServerClient(url.removeprefix("http://"))
                for rid in ("t0", "t1"):
                    arrays = {"INPUT0": a_add_sub, "INPUT1": a_add_sub}
                    client.infer("add_sub", _tensors(httpclient, arrays), request_id=rid)
                client.close()
        expected, got = ask(theirs, model, body), ask(ours, model, body)
        same = expected == got if expected[0] < 400 else got[0] >= 400
        detail = "" if same else f"triton {expected}, sordino {got}"
        checks.append({"check": f"trace setting {what}", "protocol": "http", "equal": same,
                       "detail": detail})  # fmt: skip
        print(f"{'ok  ' if same else 'DIFF'} http trace setting {what} {detail}")
    return checks


def traced_requests(path: Path) -> list[tuple[str, str, list[str]]]:
    """The traces in ``PATH.0``, ``PATH.1``, … (a log frequency of 1: each written as it
    is taken, not at the server's stop): request id, model, the timestamps' names."""
    found: dict[int, dict[str, Any]] = {}
    files = sorted(path.parent.glob(f"{path.name}.*"), key=lambda p: int(p.suffix[1:]))
    for record in (r for file in files for r in json.loads(file.read_text())):
        trace = found.setdefault(record["id"], {"names": []})
        if "timestamps" in record:
            trace["names"] += [t["name"] for t in record["timestamps"]]
        else:
            trace.update(record)
    return [(t.get("request_id", ""), t.get("model_name", ""), sorted(t["names"]))
            for _, t in sorted(found.items())]  # fmt: skip


def trace_files_check(theirs: Path, ours: Path) -> dict[str, Any]:
    """Both servers' trace files once each holds its two traces (5 s at most: a trace is
    written after its answer)."""
    for _ in range(50):
        expected, got = traced_requests(theirs), traced_requests(ours)
        if len(expected) >= 2 and len(got) >= 2:
            break
        time.sleep(0.1)
    same = expected == got and len(got) == 2
    print(f"{'ok  ' if same else 'DIFF'} http trace files {got}")
    return {"check": "trace files", "protocol": "http", "equal": same,
            "detail": f"triton {expected}, sordino {got}"}  # fmt: skip


OVERRIDE: dict[str, Any] = {
    "backend": "python",
    "input": [{"name": f"INPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
    "output": [{"name": f"OUTPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
    "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
}
"""add_sub's configuration with two instances: a load's ``config`` parameter."""


def override_run(url: str) -> list[Any]:
    """add_sub loaded with :data:`OVERRIDE`, again without it, then unloaded and loaded:
    each answer's status and add_sub's instance count after it."""

    def instances() -> int:
        with urllib.request.urlopen(f"{url}/v2/models/add_sub/config", timeout=10) as answer:
            return int(json.loads(answer.read())["instance_group"][0]["count"])

    load = f"{url}/v2/repository/models/add_sub/load"
    seen = []
    for path, body in (
        (load, {"parameters": {"config": json.dumps(OVERRIDE)}}),
        (load, {}),
        (f"{url}/v2/repository/models/add_sub/unload", {}),
        (load, {}),
    ):
        status, _ = _control_post(path, body)
        seen.append((status, instances() if "unload" not in path else 0))
    return seen


def compare_control(python: Path, repo: Path) -> list[dict[str, Any]]:
    """Both servers in explicit model control, started with nothing loaded, through
    :data:`CONTROL`; one record per step."""
    if not all((repo / name).is_dir() for name in ENSEMBLES):
        return []
    with (
        peers.triton_on(python, repo, ["--model-control-mode=explicit"]) as triton,
        sordino_server(["--model-repository", str(repo), "--no-builtin",
                        "--model-control-mode", "explicit"]) as ours,
    ):  # fmt: skip
        theirs, mine = control_run(triton.http), control_run(ours.http)
        theirs_override, mine_override = override_run(triton.http), override_run(ours.http)
    checks = []
    same = theirs_override == mine_override
    checks.append({"check": "control: load add_sub with a config, then without",
                   "protocol": "http", "equal": same,
                   "detail": f"triton {theirs_override}, sordino {mine_override}"})  # fmt: skip
    print(f"{'ok  ' if same else 'DIFF'} http control: config override {mine_override}")
    steps = [("start", "", {}), *CONTROL]
    for (action, model, parameters), a, b in zip(steps, theirs, mine, strict=True):
        what = f"control: {action} {model} {parameters or ''}".rstrip()
        checks.append({"check": what, "protocol": "http", "equal": a == b,
                       "detail": "" if a == b else f"triton {a}, sordino {b}"})  # fmt: skip
        print(f"{'ok  ' if a == b else 'DIFF'} http {what} {'' if a == b else (a, b)}")
    return checks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=EXAMPLES)
    args = parser.parse_args()
    scratch = tempfile.TemporaryDirectory(prefix="sordino-parity-")
    repo = repository(args.repository.resolve(), Path(scratch.name))
    try:
        python = peers.ensure_venv("triton", peers.TRITON_PACKAGES,
                                   "import pytriton, onnxruntime, numpy")  # fmt: skip
        traces = Path(scratch.name) / "triton-trace.json", Path(scratch.name) / "sordino-trace.json"
        with (
            peers.triton_on(python, repo, [f"--cache-config={CACHE}",
                                           f"--trace-config=triton,file={traces[0]}"]) as triton,
            sordino_server(
                ["--model-repository", str(repo), "--no-builtin", "--cache-config", CACHE,
                 "--trace-config", f"triton,file={traces[1]}"]
            ) as ours,
        ):  # fmt: skip
            models = sorted(p.name for p in repo.iterdir() if p.is_dir())
            checks = compare(triton, ours.http, ours.grpc, models)
            theirs_metrics = _metric_names(triton.metrics or "")
            ours_metrics = _metric_names(f"{ours.http}/metrics")
            family = "requests_process_latency_ns"
            found = f"triton {family in theirs_metrics}, sordino {family in ours_metrics}"
            same = family in theirs_metrics and family in ours_metrics
            checks.append(
                {
                    "check": f"/metrics has {family}",
                    "protocol": "http",
                    "equal": same,
                    "detail": found,
                }
            )
            print(f"{'ok  ' if same else 'DIFF'} http /metrics has {family} ({found})")
            checks += _triton_metrics(triton.metrics or "", f"{ours.http}/metrics", models)
            checks += logging_checks(triton.http, ours.http)
            checks += triton_transport_parity.compression_checks(triton.http, ours.http)
            checks += trace_checks(triton.http, ours.http)
            checks.append(trace_files_check(*traces))
        checks += compare_control(python, repo)
        checks += triton_loading_parity.compare(python, Path(scratch.name))
        checks += triton_loading_parity.repositories_checks(python, Path(scratch.name))
        checks += triton_loading_parity.reload_checks(python, Path(scratch.name))
    except peers.PeerError as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        sys.exit(2)
    finally:
        scratch.cleanup()
    differing = [c for c in checks if not c["equal"] and not c.get("known")]
    known = sum(1 for c in checks if c.get("known") and not c["equal"])
    equal = len(checks) - len(differing) - known
    print(f"{equal}/{len(checks)} checks equal" + (f", {known} known differences" if known else ""))
    save("triton_python_parity", {"repository": str(args.repository), "checks": checks})
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
