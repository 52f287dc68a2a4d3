"""A tiny second KServe v2 server, for tests that must work against any implementation.

It is not sordino: a few dozen lines of starlette speaking the v2 protocol's HTTP
surface (health, model metadata, infer with JSON or binary tensors) for one model,
``adder``, whose ``OUTPUT`` is the sum of each row of its ``INPUT`` (FP32, ``[-1, 4]``).
It exports no ``/metrics``. ``delay_s`` makes every answer that much slower.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["TinyKServe", "serve_tiny_kserve"]

_METADATA = {
    "name": "adder",
    "versions": ["1"],
    "platform": "numpy",
    "inputs": [{"name": "INPUT", "datatype": "FP32", "shape": [-1, 4]}],
    "outputs": [{"name": "OUTPUT", "datatype": "FP32", "shape": [-1, 1]}],
}


@dataclass
class TinyKServe:
    url: str
    requests: int = 0
    delay_s: float = 0.0


def _app(state: TinyKServe) -> Starlette:
    async def ready(request: Request) -> Response:
        return Response(status_code=200)

    async def metadata(request: Request) -> Response:
        if request.path_params["model"] != "adder":
            return JSONResponse({"error": "unknown model"}, status_code=404)
        return JSONResponse(_METADATA)

    async def infer(request: Request) -> Response:
        if request.path_params["model"] != "adder":
            return JSONResponse({"error": "unknown model"}, status_code=404)
        body = await request.body()
        length = request.headers.get("inference-header-content-length")
        header = json.loads(body[: int(length)] if length else body)
        (tensor,) = header["inputs"]
        shape = tuple(tensor["shape"])
        if length:
            array = np.frombuffer(body[int(length) :], dtype=np.float32).reshape(shape)
        else:
            array = np.asarray(tensor["data"], dtype=np.float32).reshape(shape)
        if state.delay_s:
            await asyncio.sleep(state.delay_s)
        state.requests += 1
        sums = array.sum(axis=1).reshape(-1, 1)
        answer: dict[str, object] = {
            "name": "OUTPUT",
            "datatype": "FP32",
            "shape": list(sums.shape),
        }
        answer["data"] = sums.ravel().tolist()
        return JSONResponse({"model_name": "adder", "outputs": [answer]})

    return Starlette(
        routes=[
            Route("/v2/health/ready", ready),
            Route("/v2/models/{model}", metadata),
            Route("/v2/models/{model}/infer", infer, methods=["POST"]),
        ]
    )


@contextmanager
def serve_tiny_kserve() -> Iterator[TinyKServe]:
    """Serve the tiny KServe v2 server on a free loopback port while the block runs."""
    state = TinyKServe(url="")
    config = uvicorn.Config(
        _app(state), host="127.0.0.1", port=0, log_level="warning", lifespan="off"
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="tiny-kserve", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            raise RuntimeError("the tiny KServe server did not start")
        threading.Event().wait(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    state.url = f"http://127.0.0.1:{port}"
    try:
        yield state
    finally:
        server.should_exit = True
        thread.join(timeout=10)
