"""A long fuzz campaign against a real ``sordino start``: cases tried and failures.

The same properties as the CI fuzz tests (``tests/server/test_fuzz_infer.py``,
``tests/tenants/test_fuzz_auth.py``), for many more random cases and a fresh seed
each run (printed, to replay):

- ``http``: KServe v2 JSON and binary bodies with mutations (shapes, datatypes, framing,
  ``Inference-Header-Content-Length``, ``binary_data_size``, nesting, parameters), half
  of them with a tenant's key: every answer a 200 or a 4xx with ``{"error": ...}``;
- ``grpc``: ``ModelInferRequest`` with mutations and corrupted wire bytes: OK or a
  client-error code with details;
- ``auth``: odd ``Authorization`` values over HTTP and gRPC on an ``auth.required``
  port: 200 or 401 (``UNAUTHENTICATED``), never anything else;
- ``config``: random ``tenants:``/``auth:`` sections: they load or raise ConfigError;
- ``api``: schemathesis over ``/v2/openapi.json`` (``tests/tenants/test_schemathesis.py``),
  every operation with no key, a tenant's, an admin's and a wrong one: no server error,
  documented status codes, every 4xx naming its problem.

At the end the server must still answer a normal request over both protocols.
``--frontends N`` serves the ``http``, ``grpc`` and ``auth`` targets from N front-end
processes (``server.frontends``: their own HTTP protocol, gRPC server and engine link).

    python -m bench.fuzz [--cases 2000] [--seed N] [--only api] [--frontends 2]
    # writes bench/results/fuzz.json
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import httpx
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st
from tests.server.test_fuzz_infer import (
    CLIENT_CODES,
    _normal_grpc,
    _normal_recursion_limit,
    grpc_requests,
    http_requests,
)
from tests.tenants.test_fuzz_auth import authorizations, tenant_entries
from tests.tenants.test_schemathesis import ADMIN_KEY, TENANT_KEY, fuzz_api

from bench.common import console, save, sordino_server
from sordino.config import load_config
from sordino.config.tenants import hash_key
from sordino.errors import ConfigError
from sordino.protocol.pb import kserve_v2_pb2 as pb

KEY = "fuzz-campaign-key-0123"
INFER = "/inference.GRPCInferenceService/ModelInfer"
NORMAL = {"inputs": [{"name": "pixels", "datatype": "FP32", "shape": [1, 64], "data": [1.0] * 64}]}


class Tally:
    def __init__(self) -> None:
        self.cases = 0
        self.failures: list[str] = []

    def fail(self, what: str) -> None:
        if len(self.failures) < 20:
            self.failures.append(what[:500])
        else:
            self.failures.append("")


def _run(cases: int, run_seed: int, strategy: Any, check: Callable[..., None]) -> None:
    campaign = settings(
        max_examples=cases, deadline=None, database=None,
        suppress_health_check=list(HealthCheck),
    )  # fmt: skip
    seed(run_seed)(campaign(given(strategy)(check)))()


def http_campaign(url: str, cases: int, run_seed: int) -> Tally:
    tally = Tally()
    with httpx.Client(base_url=url, timeout=60) as client:

        def check(case: tuple[str, bytes, dict[str, str]]) -> None:
            model, body, headers = case
            tally.cases += 1
            if tally.cases % 2:
                headers = {**headers, "Authorization": f"Bearer {KEY}"}
            with _normal_recursion_limit():
                answer = client.post(f"/v2/models/{model}/infer", content=body, headers=headers)
            if answer.status_code >= 500:
                tally.fail(f"{answer.status_code} {answer.text}")
            elif answer.status_code != 200 and not answer.json().get("error"):
                tally.fail(f"{answer.status_code} without an error message")

        _run(cases, run_seed, http_requests(), check)
    return tally


def grpc_campaign(target: str, cases: int, run_seed: int) -> Tally:
    tally = Tally()
    with grpc.insecure_channel(target) as channel:
        infer = channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)

        def check(data: bytes) -> None:
            tally.cases += 1
            try:
                with _normal_recursion_limit():
                    infer(data, timeout=60)
            except grpc.RpcError as error:
                if error.code() not in CLIENT_CODES or not error.details():
                    tally.fail(f"{error.code()} {error.details()}")

        _run(cases, run_seed, grpc_requests(), check)
    return tally


def auth_campaign(url: str, target: str, cases: int, run_seed: int) -> Tally:
    tally = Tally()
    body = {"inputs": NORMAL["inputs"]}
    normal = pb.ModelInferRequest(model_name="digits-classifier")
    pixels = normal.inputs.add(name="pixels", datatype="FP32", shape=[1, 64])
    pixels.contents.fp32_contents.extend([1.0] * 64)
    data = normal.SerializeToString()
    with httpx.Client(base_url=url, timeout=60) as client, grpc.insecure_channel(target) as ch:
        infer = ch.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)

        def check(authorization: str) -> None:
            tally.cases += 1
            valid = authorization.partition(" ")[0].lower() == "bearer" and (
                authorization.partition(" ")[2].strip() == KEY
            )
            answer = client.post(
                "/v2/models/digits-classifier/infer",
                json=body,
                headers={"Authorization": authorization},
            )
            if answer.status_code != (200 if valid else 401):
                tally.fail(f"HTTP {answer.status_code} for {authorization!r}")
            try:
                infer(data, metadata=(("authorization", authorization),), timeout=60)
                if not valid:
                    tally.fail(f"gRPC OK for {authorization!r}")
            except grpc.RpcError as error:
                if valid or error.code() != grpc.StatusCode.UNAUTHENTICATED:
                    tally.fail(f"gRPC {error.code()} for {authorization!r}")

        _run(cases, run_seed, authorizations, check)
    return tally


def config_campaign(cases: int, run_seed: int) -> Tally:
    tally = Tally()
    auth = st.dictionaries(st.sampled_from(["required", "admin_keys", "x"]), st.text(), max_size=2)

    def check(case: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
        tally.cases += 1
        tenants, auth_section = case
        try:
            load_config(None, {"tenants": tenants, "auth": auth_section})
        except ConfigError as error:
            if not str(error):
                tally.fail("a ConfigError without a message")
        except Exception as error:  # the property: nothing but ConfigError
            tally.fail(f"{type(error).__name__}: {error}")

    _run(cases, run_seed, st.tuples(st.lists(tenant_entries, max_size=3), auth), check)
    return tally


def _config(folder: Path, required: bool) -> Path:
    path = folder / ("auth.yaml" if required else "tenants.yaml")
    path.write_text(
        f'tenants:\n  - name: fuzz\n    keys: ["{hash_key(KEY)}"]\n'
        f"auth:\n  required: {'true' if required else 'false'}\n"
    )
    return path


def api_campaign(folder: Path, cases: int, run_seed: int) -> tuple[Tally, bool]:
    """Schemathesis over the OpenAPI document, ``cases`` spread over its operations."""
    path = folder / "api.yaml"
    path.write_text(
        f'tenants:\n  - name: acme\n    keys: ["{hash_key(TENANT_KEY)}"]\n'
        f'auth:\n  required: true\n  admin_keys: ["{hash_key(ADMIN_KEY)}"]\n'
    )
    tally = Tally()
    with sordino_server(["--config", str(path)]) as ends:
        result = fuzz_api(ends.http, max(1, cases // 50), run_seed)
        ready = httpx.get(f"{ends.http}/v2/health/ready", timeout=30).status_code == 200
    tally.cases = result.cases
    for failure in result.failures:
        tally.fail(failure)
    return tally, ready


def _still_serves(url: str, target: str, headers: dict[str, str]) -> bool:
    answer = httpx.post(f"{url}/v2/models/digits-classifier/infer", json=NORMAL, headers=headers)
    with grpc.insecure_channel(target) as channel:
        infer = channel.unary_unary(INFER, response_deserializer=pb.ModelInferResponse.FromString)
        metadata = tuple((k.lower(), v) for k, v in headers.items())
        reply = infer(_normal_grpc(), metadata=metadata, timeout=60)
    return answer.status_code == 200 and reply.model_name == "digits-classifier"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000, help="cases per target")
    parser.add_argument("--seed", type=int, default=None, help="replay a run's seed")
    parser.add_argument("--only", choices=["api"], default=None, help="run only this target")
    parser.add_argument(
        "--frontends",
        type=int,
        default=1,
        help="front-end processes of the http, grpc, auth servers",
    )
    args = parser.parse_args()
    if args.frontends < 1:
        parser.error("--frontends must be 1 or more")
    front = ["--frontends", str(args.frontends)]
    run_seed = args.seed if args.seed is not None else random.randrange(2**32)
    console.print(f"seed {run_seed} (replay with --seed {run_seed})")
    results: dict[str, Tally] = {}
    served: dict[str, bool] = {}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        results["api"], served["api port"] = api_campaign(folder, args.cases, run_seed)
        if args.only is None:
            with sordino_server(["--config", str(_config(folder, False)), *front]) as ends:
                results["http"] = http_campaign(ends.http, args.cases, run_seed)
                results["grpc"] = grpc_campaign(ends.grpc, args.cases, run_seed)
                served["open port"] = _still_serves(ends.http, ends.grpc, {})
            with sordino_server(["--config", str(_config(folder, True)), *front]) as ends:
                results["auth"] = auth_campaign(ends.http, ends.grpc, args.cases, run_seed)
                served["auth port"] = _still_serves(
                    ends.http, ends.grpc, {"Authorization": f"Bearer {KEY}"}
                )
            results["config"] = config_campaign(args.cases, run_seed)
    seconds = time.perf_counter() - started
    for name, tally in results.items():
        console.print(f"{name:7} {tally.cases:6} cases, {len(tally.failures)} failures")
        for failure in tally.failures[:5]:
            console.print(f"        {failure}")
    console.print(f"still serving afterwards: {served}; {seconds:.0f} s")
    save(
        "fuzz" if args.only is None else f"fuzz-{args.only}",
        {
            "seed": run_seed,
            "frontends": args.frontends,
            "seconds": seconds,
            "targets": {
                name: {"cases": t.cases, "failures": len(t.failures), "examples": t.failures[:20]}
                for name, t in results.items()
            },
            "still_serving": served,
        },
    )
    failed = any(t.failures for t in results.values()) or not all(served.values())
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
