"""Loading models with their files, and from a model's code, side by side with Triton
(and what ``triton_python_backend_utils``' type helpers answer).

Part of ``python -m bench.triton_python_parity`` (its ``main`` calls :func:`compare`);
runnable alone: ``PYTHONPATH=. python -m bench.triton_loading_parity``. Both servers
run in explicit model control on the same scratch repository (add_sub, and the
``model_loader`` fixture twice: as it is, and as ``loader_init``, whose ``initialize``
loads add_sub), and go through the same steps:

- **uploads** (:data:`UPLOADS`): Triton's load API with ``file:`` parameters over HTTP —
  a new name, a repository model's folder replaced for one load, refusals; the
  outcome of each step (the status class: 2xx or not) and the versions ready after it;
- **the model loading API** (:data:`LOADING`): ``pb_utils.load_model``,
  ``unload_model`` and ``is_model_ready`` from ``model_loader``'s ``execute``, each
  step's ``ok`` and ``ready``; then ``loader_init`` loaded by the client (its
  ``initialize`` loads add_sub), and ``model_loader`` unloading itself;
- **the utilities** fixture: what ``pb_utils``' type tables, converters, BYTES
  (de)serialization and request release flags give, as one JSON text;
- **two repositories** (``--model-repository`` twice: add_sub in one, auto_complete in
  the other): the index and each model's readiness; and with add_sub in both, whether
  the server starts (Triton, with its default ``--exit-on-error``, does not; nor does
  sordino);
- **a reload under traffic** (:func:`reload_checks`: ``tests/fixtures/triton_reload``,
  whose ``initialize`` takes 2 s): two clients ask version 1 throughout a reload after
  its ``config.pbtxt`` changed, then a reload that fails — the failures they saw,
  whether each saw the old load's answers and then only the new one's, the index
  states and readiness meanwhile, and what the failed reload left serving; then its
  instance count alone changed, 1 to 2 to 1 (:func:`update_run`): which processes
  answered after each load (Triton updates such a model, keeping its instances).

Messages differ (each server words its own) and are not compared. Steps left out
because Triton 2.51 fails on them (measured): ``pb_utils.load_model`` with files and no
config closes Triton's connection (the server process ends); and Triton's answer now
and then never came, or its process ended, during these calls (3 runs of 8 on
2026-12-06: one at a ``pb_utils.load_model`` whose config is not JSON, now left out, two
before :func:`_settle` waited out each unload); sordino refuses both loads, saying why
(``tests/backends/test_python_model_loading.py``). A step whose answer does not come
within two minutes is recorded as such (a difference), not raised.
"""

from __future__ import annotations

import base64
import json
import shutil
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as httpclient
from tests.server.test_reload_serving import RELOADED, reloaded_config

from bench import peers
from bench.common import sordino_server

FIXTURES = Path(__file__).parent.parent / "tests" / "fixtures"
ADD_SUB = FIXTURES / "triton_python_examples" / "add_sub"
LOADER = FIXTURES / "triton_python_answers" / "model_loader"
UTILITIES = FIXTURES / "triton_python_answers" / "utilities"

CONFIG = json.dumps(
    {
        "backend": "python",
        "input": [{"name": f"INPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
        "output": [{"name": f"OUTPUT{i}", "data_type": "TYPE_FP32", "dims": [4]} for i in (0, 1)],
    }
)
CODE = base64.b64encode((ADD_SUB / "1" / "model.py").read_bytes()).decode()

UPLOADS: list[tuple[str, str, dict[str, Any]]] = [
    ("files without config", "up", {"file:1/model.py": CODE}),
    ("files and config, a new name", "up", {"config": CONFIG, "file:1/model.py": CODE}),
    ("again without files (not in the repository)", "up", {}),
    ("config alone (not in the repository)", "up", {"config": CONFIG}),
    ("a path that climbs out", "up2", {"config": CONFIG, "file:../../x/model.py": CODE}),
    ("an empty path", "up3", {"config": CONFIG, "file:": CODE}),
    ("a repository model", "add_sub", {}),
    ("a repository model's folder replaced (version 2)", "add_sub",
     {"config": CONFIG, "file:2/model.py": CODE}),
    ("the repository model again without files", "add_sub", {}),
]  # fmt: skip
"""(what, model, load parameters): each load, then the versions ready of ``up`` and
add_sub."""

LOADING: list[dict[str, Any]] = [
    {"op": "ready", "model": "add_sub"},
    {"op": "load", "model": "add_sub"},
    {"op": "ready", "model": "add_sub"},
    {"op": "ready", "model": "add_sub", "version": "1"},
    {"op": "ready", "model": "add_sub", "version": "2"},
    {"op": "unload", "model": "add_sub"},
    {"op": "ready", "model": "add_sub"},
    {"op": "load", "model": "nowhere"},
    {"op": "unload", "model": "nowhere"},
    {"op": "load", "model": "sent", "config": CONFIG, "files": {"file:1/model.py": CODE}},
    {"op": "ready", "model": "sent"},
]
"""``model_loader``'s commands, in order."""

KNOWN = {
    "loading API: unload nowhere": "sordino refuses to unload a model it does not know "
    "(NOT_FOUND); Triton answers success",
}


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(url, json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _settle(client: httpclient.InferenceServerClient) -> None:
    """Wait until no model is LOADING or UNLOADING: Triton answers an unload before its
    model has left, and a load of it meanwhile can crash or hang Triton 2.51 (its own
    test sleeps 30 s after each unload)."""
    for _ in range(600):
        states = {entry.get("state") for entry in client.get_model_repository_index()}
        if not states & {"LOADING", "UNLOADING"}:
            return
        time.sleep(0.1)


def _ready(client: httpclient.InferenceServerClient, model: str) -> list[str]:
    return [v for v in ("1", "2", "3") if client.is_model_ready(model, v)]


def upload_run(url: str) -> list[tuple[bool, list[str], list[str]]]:
    """Each :data:`UPLOADS` step: whether it succeeded, and the versions then ready."""
    client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=120)
    seen = []
    for _, model, parameters in UPLOADS:
        status = _post(f"{url}/v2/repository/models/{model}/load", {"parameters": parameters})
        _settle(client)
        seen.append((200 <= status < 300, _ready(client, "up"), _ready(client, "add_sub")))
    client.unload_model("up")
    client.unload_model("add_sub")
    _settle(client)
    return seen


def _ask(client: httpclient.InferenceServerClient, command: dict[str, Any]) -> dict[str, Any]:
    tensor = httpclient.InferInput("COMMAND", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([json.dumps(command).encode()], dtype=np.object_))
    try:
        result = client.infer("model_loader", [tensor]).as_numpy("RESULT")
    except Exception as exc:  # no answer (a server that hangs or ends): a difference
        return {"ok": None, "ready": f"no answer: {type(exc).__name__}"}
    answer = json.loads(result.reshape(-1)[0])
    return {"ok": answer["ok"], "ready": answer.get("ready")}


def loading_run(url: str) -> list[Any]:
    """Each :data:`LOADING` step's answer, then loader_init's load and the self-unload."""
    client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=120)
    client.load_model("model_loader")
    seen: list[Any] = []
    for command in LOADING:
        print(f"  {url}: {command['op']} {command['model']}", flush=True)
        seen.append(_ask(client, command))
        _settle(client)
    loaded = _post(f"{url}/v2/repository/models/loader_init/load", {})
    _settle(client)
    seen.append((200 <= loaded < 300, client.is_model_ready("add_sub")))
    seen.append((_ask(client, {"op": "unload", "model": "model_loader"}),
                 client.is_model_ready("model_loader")))  # fmt: skip
    return seen


def utilities_run(url: str) -> Any:
    """The utilities fixture's answer (loaded, asked once, unloaded)."""
    client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=120)
    client.load_model("utilities")
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.ones(1, dtype=np.float32))
    answer = json.loads(client.infer("utilities", [tensor]).as_numpy("RESULT").reshape(-1)[0])
    client.unload_model("utilities")
    _settle(client)
    return answer


def repository(into: Path) -> Path:
    """The scratch repository both servers serve."""
    repo = into / "loading"
    shutil.copytree(ADD_SUB, repo / "add_sub")
    shutil.copytree(LOADER, repo / "model_loader")
    shutil.copytree(LOADER, repo / "loader_init")
    shutil.copytree(UTILITIES, repo / "utilities")
    config = repo / "loader_init" / "config.pbtxt"
    config.write_text(
        config.read_text()
        + 'parameters { key: "LOAD_AT_INITIALIZE" value { string_value: "add_sub" } }\n'
    )
    return repo


def compare(python: Path, into: Path) -> list[dict[str, Any]]:
    """Both servers through :data:`UPLOADS` and :data:`LOADING`; one check a step."""
    repo = repository(into)
    with (
        peers.triton_on(python, repo, ["--model-control-mode=explicit"]) as triton,
        sordino_server(["--model-repository", str(repo), "--no-builtin",
                        "--model-control-mode", "explicit"]) as ours,
    ):  # fmt: skip
        uploads = upload_run(triton.http), upload_run(ours.http)
        utilities = utilities_run(triton.http), utilities_run(ours.http)
        try:  # last: Triton 2.51 may abort in it (see _settle)
            theirs: list[Any] | None = loading_run(triton.http)
        except OSError as exc:  # it ended: nothing answers on its port
            print(f"SKIP loading API: Triton ended during its run ({exc}; its log: "
                  f"{peers.PEERS / 'triton-server.log'})", flush=True)  # fmt: skip
            theirs = None
        loading = theirs, loading_run(ours.http)
    names = ["pb_utils type helpers and release flags"]
    names += [f"uploads: {what}" for what, _, _ in UPLOADS]
    names += [
        f"loading API: {c['op']} {c['model']} {c.get('version', '')}".rstrip() for c in LOADING
    ]
    names += ["loading API: initialize loads add_sub", "loading API: a model unloads itself"]
    checks = []
    if loading[0] is None:  # no comparison for those steps
        names = names[: 1 + len(UPLOADS)]
    theirs_all = [utilities[0], *uploads[0], *(loading[0] or [])]
    mine_all = [utilities[1], *uploads[1], *(loading[1] if loading[0] is not None else [])]
    for name, theirs, mine in zip(names, theirs_all, mine_all, strict=True):
        same = theirs == mine
        check = {"check": name, "protocol": "http", "equal": same,
                 "detail": "" if same else f"triton {theirs}, sordino {mine}"}  # fmt: skip
        if name in KNOWN:
            check |= {"known": True, "detail": f"{check['detail']}: {KNOWN[name]}"}
        checks.append(check)
        mark = "ok  " if same else ("known" if name in KNOWN else "DIFF")
        print(f"{mark} http {name} {'' if same else (theirs, mine)}", flush=True)
    return checks


def _index(url: str) -> list[tuple[str, str, str]]:
    client = httpclient.InferenceServerClient(url.removeprefix("http://"))
    entries = client.get_model_repository_index()
    client.close()
    return [(e["name"], e.get("version", ""), e.get("state", "")) for e in entries]


def repositories_checks(python: Path, into: Path) -> list[dict[str, Any]]:
    """Both servers on two repositories, then on two that share a model name."""
    one, two = into / "one", into / "two"
    shutil.copytree(ADD_SUB, one / "add_sub")
    shutil.copytree(ADD_SUB.parent / "auto_complete", two / "auto_complete")
    ours_flags = ["--model-repository", str(one), "--model-repository", str(two), "--no-builtin"]
    with (
        peers.triton_on(python, one, [f"--model-repository={two}"]) as triton,
        sordino_server(ours_flags) as ours,
    ):
        indexes = _index(triton.http), _index(ours.http)
    shutil.copytree(ADD_SUB, two / "add_sub")
    started = []
    for start in (
        lambda: peers.triton_on(python, one, [f"--model-repository={two}"]),
        lambda: sordino_server(ours_flags),
    ):
        try:
            with start():
                started.append(True)
        except (peers.PeerError, RuntimeError):
            started.append(False)
    checks = []
    for what, theirs, mine in (
        ("two repositories: the index", *indexes),
        ("two repositories with a name in both: the server starts", *started),
    ):
        same = theirs == mine
        checks.append({"check": what, "protocol": "http", "equal": same,
                       "detail": f"triton {theirs}, sordino {mine}"})  # fmt: skip
        print(f"{'ok  ' if same else 'DIFF'} http {what} {'' if same else (theirs, mine)}")
    return checks


class _Asking:
    """Two HTTP clients asking ``slow`` version 1 in turn until stopped: each answer's
    added number per client, in order, and the failures."""

    def __init__(self, url: str) -> None:
        self._url, self._stop = url.removeprefix("http://"), threading.Event()
        self.each: list[list[float]] = [[], []]
        self.failures: list[str] = []
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in (0, 1)]
        for thread in self._threads:
            thread.start()

    def _run(self, index: int) -> None:
        client = httpclient.InferenceServerClient(self._url, network_timeout=60)
        tensor = httpclient.InferInput("X", [1, 1], "FP32")
        tensor.set_data_from_numpy(np.array([[10.0]], dtype=np.float32))
        for _ in range(100_000):  # bounded; stops far earlier
            if self._stop.is_set():
                return
            try:
                answer = client.infer("slow", [tensor], model_version="1").as_numpy("Y")
                self.each[index].append(float(answer.reshape(-1)[0]) - 10.0)
            except Exception as exc:
                self.failures.append(f"{type(exc).__name__}: {exc}"[:300])
                time.sleep(0.05)

    def answered(self) -> int:
        return sum(len(each) for each in self.each)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(120)


def reload_run(url: str, folder: Path) -> list[Any]:
    """``slow`` reloaded under traffic (its ``initialize`` takes 2 s), then a reload
    that fails: what the clients saw, and what the index and readiness said meanwhile."""
    client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=120)
    config = folder / "config.pbtxt"
    config.write_text(reloaded_config(1))
    client.load_model("slow")
    asking = _Asking(url)
    states: set[str] = set()
    ready = True
    try:
        for _ in range(600):
            if asking.answered() >= 10:
                break
            time.sleep(0.05)
        config.write_text(reloaded_config(2, sleep=2.0))
        loading = threading.Thread(target=_post, args=(f"{url}/v2/repository/models/slow/load", {}))
        loading.start()
        while loading.is_alive():
            index = client.get_model_repository_index()
            states |= {e.get("state", "") for e in index if e["name"] == "slow"}
            ready = ready and client.is_model_ready("slow", "1")
            time.sleep(0.1)
        seen = asking.answered()
        for _ in range(600):
            if asking.answered() >= seen + 10:
                break
            time.sleep(0.05)
        config.write_text(reloaded_config(3, fail=True))
        failed = _post(f"{url}/v2/repository/models/slow/load", {})
        seen = asking.answered()
        for _ in range(600):
            if asking.answered() >= seen + 10:
                break
            time.sleep(0.05)
    finally:
        asking.stop()
    for failure in asking.failures:
        print(f"  {url}: a request failed: {failure}", flush=True)
    in_order = all(each == sorted(each) for each in asking.each)
    after = sorted({added for each in asking.each for added in each[-3:]})
    client.unload_model("slow")
    _settle(client)
    return [
        len(asking.failures),
        in_order and {added for each in asking.each for added in each} == {1.0, 2.0},
        sorted(states),
        ready,
        200 <= failed < 300,
        after,
    ]


def _pids(url: str) -> set[int]:
    """The processes 40 requests to ``slow`` (4 clients at once) were answered by."""
    tensor = httpclient.InferInput("X", [1, 1], "FP32")
    tensor.set_data_from_numpy(np.array([[10.0]], dtype=np.float32))
    seen: set[int] = set()

    def ask() -> None:
        client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=60)
        for _ in range(10):
            seen.add(int(client.infer("slow", [tensor]).as_numpy("PID").reshape(-1)[0]))

    asking = [threading.Thread(target=ask) for _ in range(4)]
    for thread in asking:
        thread.start()
    for thread in asking:
        thread.join(120)
    return seen


def update_run(url: str, folder: Path) -> list[Any]:
    """``slow``'s instance count changed alone (1, then 2, then 1; each execute takes
    20 ms): which processes answered after each load — Triton updates such a model
    instead of reloading it, keeping the instances it has."""
    client = httpclient.InferenceServerClient(url.removeprefix("http://"), network_timeout=120)
    seen = []
    for count in (1, 2, 1):
        (folder / "config.pbtxt").write_text(reloaded_config(1, count=count, work=0.02))
        client.load_model("slow")
        _settle(client)
        seen.append(_pids(url))
    client.unload_model("slow")
    _settle(client)
    one, two, back = seen
    return [len(one), (len(two), one <= two), (len(back), back <= two)]


UPDATE_STEPS = (
    "instance count 1: processes answering",
    "instance count 1 -> 2: processes answering, the one before among them",
    "instance count 2 -> 1: processes answering, one of the two before",
)
RELOAD_STEPS = (
    "reload under traffic: requests that failed",
    "reload under traffic: the old load answered until the new one did, then the new one",
    "reload under traffic: the index states seen during it",
    "reload under traffic: ready throughout",
    "a reload that fails: the load succeeded",
    "a reload that fails: what the last answers added",
)


def reload_checks(python: Path, into: Path) -> list[dict[str, Any]]:
    """Both servers through :func:`reload_run` (one after the other: the same folder)."""
    repo = into / "reloading"
    shutil.copytree(RELOADED, repo / "slow")
    flags = ["--model-repository", str(repo), "--no-builtin", "--model-control-mode", "explicit"]
    with peers.triton_on(python, repo, ["--model-control-mode=explicit"]) as triton:
        theirs = reload_run(triton.http, repo / "slow") + update_run(triton.http, repo / "slow")
    with sordino_server(flags) as ours:
        mine = reload_run(ours.http, repo / "slow") + update_run(ours.http, repo / "slow")
    checks = []
    for what, their, my in zip(RELOAD_STEPS + UPDATE_STEPS, theirs, mine, strict=True):
        same = their == my
        checks.append({"check": what, "protocol": "http", "equal": same,
                       "detail": f"triton {their}, sordino {my}"})  # fmt: skip
        print(f"{'ok  ' if same else 'DIFF'} http {what}: triton {their}, sordino {my}")
    return checks


def main() -> None:
    scratch = tempfile.TemporaryDirectory(prefix="sordino-loading-")
    try:
        python = peers.ensure_venv("triton", peers.TRITON_PACKAGES,
                                   "import pytriton, onnxruntime, numpy")  # fmt: skip
        checks = compare(python, Path(scratch.name))
        checks += repositories_checks(python, Path(scratch.name))
        checks += reload_checks(python, Path(scratch.name))
    except peers.PeerError as exc:
        print(f"cannot run: {exc}", file=sys.stderr)
        sys.exit(2)
    finally:
        scratch.cleanup()
    differing = [c for c in checks if not c["equal"] and not c.get("known")]
    print(f"{len(checks) - len(differing)}/{len(checks)} checks equal or known")
    sys.exit(1 if differing else 0)


if __name__ == "__main__":
    main()
