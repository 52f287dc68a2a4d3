"""Fuzzing credentials and tenant settings: no key, however odd, is a server error.

Derandomized like ``tests/server/test_fuzz_infer.py``; ``bench/fuzz.py`` runs the same
properties for many more cases.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sordino.config import load_config
from sordino.config.tenants import hash_key
from sordino.errors import ConfigError
from sordino.models.repository import builtin_sources
from sordino.protocol.pb import kserve_v2_pb2 as pb
from sordino.testing import RunningServer, serve_in_thread
from tests.tenants.test_auth import BODY

KEY = "fuzz-tenant-key-0123"
FUZZ = settings(
    max_examples=120,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
PRINTABLE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80)
# HTTP header values carry no surrounding white space (h11 refuses to send it).
authorizations = (
    PRINTABLE
    | PRINTABLE.map(lambda text: "Bearer " + text)
    | st.sampled_from(
        [
            "Bearer",
            "Bearer ",
            "bearer " + KEY,
            "Bearer  " + KEY,
            "Basic " + KEY,
            "Bearer " + KEY * 200,
            "Bearer sha256:" + "0" * 64,
        ]
    )
).map(str.strip)
settings_values: st.SearchStrategy[Any] = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=20)
    | st.sampled_from(["800/s", "0/s", "1e9/min", "-5/s", "high", "low", "1GB", "sha256:"])
    | st.lists(st.text(max_size=10), max_size=3)
)
tenant_entries = st.dictionaries(
    st.sampled_from(
        [
            "name",
            "keys",
            "weight",
            "rate",
            "burst",
            "max_concurrency",
            "memory_quota",
            "max_priority",
            "unknown",
        ]
    ),
    settings_values,
    max_size=6,
)


@pytest.fixture(scope="module")
def server() -> Iterator[RunningServer]:
    config = load_config(
        None,
        {
            "tenants": [{"name": "fuzz", "keys": [hash_key(KEY)], "rate": "100000/s"}],
            "auth": {"required": True},
        },
    )
    with serve_in_thread(config, [s for s in builtin_sources() if s.name == "simple"]) as running:
        yield running


def test_http_credentials_are_200_or_401(server: RunningServer) -> None:
    with httpx.Client(base_url=server.url, timeout=30) as client:

        @FUZZ
        @given(authorizations, st.sampled_from(["/v2/models/simple/infer", "/v2", "/metrics"]))
        def check(authorization: str, path: str) -> None:
            headers = {"Authorization": authorization}
            if path.endswith("/infer"):
                answer = client.post(path, json=BODY, headers=headers)
            else:
                answer = client.get(path, headers=headers)
            valid = authorization.partition(" ")[0].lower() == "bearer" and (
                authorization.partition(" ")[2].strip() == KEY
            )
            assert answer.status_code == (200 if valid else 401), (authorization, answer.text)
            if not valid:
                assert answer.json()["error"]

        check()
        assert client.post(
            "/v2/models/simple/infer", json=BODY, headers={"Authorization": f"Bearer {KEY}"}
        ).is_success


def test_grpc_credentials_are_ok_or_unauthenticated(server: RunningServer) -> None:
    message = pb.ModelInferRequest(model_name="simple")
    for name in ("INPUT0", "INPUT1"):
        tensor = message.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        tensor.contents.int_contents.extend([1] * 16)
    data = message.SerializeToString()
    with grpc.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
        infer: Callable[..., Any] = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer",
            response_deserializer=pb.ModelInferResponse.FromString,
        )

        @FUZZ
        @given(authorizations)
        def check(authorization: str) -> None:
            try:
                infer(data, metadata=(("authorization", authorization),), timeout=30)
            except grpc.RpcError as error:
                assert error.code() == grpc.StatusCode.UNAUTHENTICATED, error.details()
                assert error.details()

        check()


@FUZZ
@given(
    st.lists(tenant_entries, max_size=3),
    st.dictionaries(
        st.sampled_from(["required", "admin_keys", "other"]), settings_values, max_size=2
    ),
)
def test_tenant_settings_load_or_say_what_is_wrong(
    tenants: list[dict[str, Any]], auth: dict[str, Any]
) -> None:
    try:
        load_config(None, {"tenants": tenants, "auth": auth})
    except ConfigError as error:
        assert str(error)
