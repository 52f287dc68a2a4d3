"""deploy/k8s, deploy/kserve and the Dockerfile: valid, and in step with the server.

- Every Kubernetes object validates against the Kubernetes schemas
  (``kubernetes-validate``, strict: an unknown field fails); the KServe objects against
  KServe's own CRDs (``tests/deploy/crds``), whose ``openAPIV3Schema`` is applied with
  ``jsonschema`` and walked so that a field the CRD does not declare fails too.
- The containers' arguments are flags ``sordino start`` has, their ports are the ones
  the probes and the Service use, and the probes' paths answer on a real server
  started from the ConfigMap's ``runtime_config.yaml``; the HPA's metric is one that
  server exports; the termination grace period covers preStop plus the drain.
"""

from __future__ import annotations

import functools
import gzip
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import httpx
import jsonschema
import pytest
import yaml

from sordino.cli.start import start as start_command
from sordino.config import load_config
from sordino.testing import serve_in_thread

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed (the test extra has it)"
)

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CRDS = Path(__file__).parent / "crds"
KUBERNETES = "1.33.0"
KSERVE_KINDS = {"ClusterServingRuntime", "InferenceService", "ServingRuntime"}


def documents() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc:
                found.append((f"{path.relative_to(ROOT)}:{doc['kind']}", doc))
    return found


DOCS = documents()


def kind(name: str) -> dict[str, Any]:
    (doc,) = [d for _, d in DOCS if d["kind"] == name]
    return doc


def test_the_set_is_complete() -> None:
    kinds = sorted(d["kind"] for _, d in DOCS)
    assert kinds == sorted(
        [
            "ClusterServingRuntime",
            "ConfigMap",
            "ConfigMap",
            "Deployment",
            "HorizontalPodAutoscaler",
            "InferenceService",
            "PersistentVolumeClaim",
            "Service",
        ]
    )


@pytest.mark.parametrize(
    "doc", [d for w, d in DOCS if d["kind"] not in KSERVE_KINDS], ids=lambda d: d["kind"]
)
def test_kubernetes_objects_validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


@functools.cache
def load_crd(kind: str) -> dict[str, Any]:
    """KServe's CRD for ``kind``, parsed once per session and shared: read it, never change it.

    The InferenceService one is 2 MB of YAML: half a minute with the pure-Python parser,
    a few seconds with libyaml's.
    """
    plural = {
        "ClusterServingRuntime": "clusterservingruntimes",
        "InferenceService": "inferenceservices",
    }
    path = CRDS / f"serving.kserve.io_{plural[kind]}.yaml.gz"
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loaded: dict[str, Any] = yaml.load(gzip.decompress(path.read_bytes()), Loader=loader)
    return loaded


def crd_schema(doc: dict[str, Any]) -> dict[str, Any]:
    crd = load_crd(doc["kind"])
    group, version = doc["apiVersion"].split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == doc["kind"]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    schema: dict[str, Any] = served["schema"]["openAPIV3Schema"]
    return schema


@functools.cache
def crd_validator(kind: str, api_version: str) -> jsonschema.Draft4Validator:
    """A validator of ``kind``'s CRD schema, itself checked against the metaschema once.

    Draft 4: a CRD's ``openAPIV3Schema`` is an OpenAPI 3.0 schema, whose keywords are JSON
    Schema draft 4's (as the API server reads them). Checking 2 MB of schema against the
    2020-12 metaschema took 15 s of CPU; against draft 4's, 2 s.
    """
    schema = crd_schema({"kind": kind, "apiVersion": api_version})
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


def undeclared(value: Any, schema: dict[str, Any], where: str = "") -> Iterator[str]:
    """Paths in ``value`` that ``schema`` does not declare (structural schemas only)."""
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return
        properties = schema.get("properties")
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            if where == "" and key in ("apiVersion", "kind", "metadata"):
                continue
            if properties is not None and key in properties:
                yield from undeclared(item, properties[key], f"{where}.{key}")
            elif isinstance(extra, dict):
                yield from undeclared(item, extra, f"{where}.{key}")
            else:
                yield f"{where}.{key}"
    elif isinstance(value, list) and "items" in schema:
        for n, item in enumerate(value):
            yield from undeclared(item, schema["items"], f"{where}[{n}]")


@pytest.mark.parametrize(
    "doc", [d for _, d in DOCS if d["kind"] in KSERVE_KINDS], ids=lambda d: d["kind"]
)
def test_kserve_objects_match_the_kserve_crds(doc: dict[str, Any]) -> None:
    schema = crd_schema(doc)
    crd_validator(doc["kind"], doc["apiVersion"]).validate(
        {k: v for k, v in doc.items() if k != "metadata"}
    )
    assert list(undeclared(doc, schema)) == []


def test_the_crd_check_catches_a_typo() -> None:
    """The walk is not vacuous: a misspelt field and a wrong type are both caught."""
    doc = yaml.safe_load(yaml.safe_dump(kind("InferenceService")))
    doc["spec"]["predictor"]["model"]["modelFormats"] = {"name": "onnx"}
    assert list(undeclared(doc, crd_schema(doc))) == [".spec.predictor.model.modelFormats"]
    doc = yaml.safe_load(yaml.safe_dump(kind("ClusterServingRuntime")))
    doc["spec"]["supportedModelFormats"][0]["autoSelect"] = "yes"
    with pytest.raises(jsonschema.ValidationError):
        crd_validator(doc["kind"], doc["apiVersion"]).validate(doc)


def flag_values(args: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a ``sordino start`` command line; every flag must exist."""
    assert args[0] == "start"
    flags = {
        name: option
        for option in start_command.params
        if isinstance(option, click.Option)
        for name in (*option.opts, *option.secondary_opts)
    }
    values: dict[str, str] = {}
    rest = args[1:]
    while rest:
        name = rest.pop(0)
        assert name in flags, f"sordino start has no flag {name}"
        option = flags[name]
        if option.is_flag:
            values[name] = "true"
        else:
            values[name] = rest.pop(0)
            if isinstance(option.type, click.Choice):
                assert values[name] in option.type.choices
    return values


def containers() -> list[tuple[str, dict[str, Any]]]:
    return [
        ("deployment", kind("Deployment")["spec"]["template"]["spec"]["containers"][0]),
        ("kserve", kind("ClusterServingRuntime")["spec"]["containers"][0]),
    ]


@pytest.mark.parametrize(("where", "container"), containers(), ids=lambda v: str(v)[:10])
def test_args_ports_and_probes_agree(where: str, container: dict[str, Any]) -> None:
    flags = flag_values(container["args"])
    assert flags["--host"] == "0.0.0.0"
    http = int(flags["--http-port"])
    named = {p.get("name", str(p["containerPort"])): p["containerPort"] for p in container["ports"]}
    assert http in named.values()
    for probe, path in (
        ("livenessProbe", "/v2/health/live"),
        ("readinessProbe", "/v2/health/ready"),
        ("startupProbe", "/v2/health/ready"),
    ):
        get = container[probe]["httpGet"]
        assert get["path"] == path
        port = get["port"]
        assert (named[port] if isinstance(port, str) else port) == http
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "model loads take time"
    if where == "deployment":
        assert named["grpc"] == int(flags["--grpc-port"])
        assert flags["--config"] == "/etc/sordino/runtime_config.yaml"


def test_service_targets_the_container_ports() -> None:
    ports = {p["name"] for p in containers()[0][1]["ports"]}
    assert {p["targetPort"] for p in kind("Service")["spec"]["ports"]} == ports


@pytest.fixture(scope="module")
def configured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A real server started from the ConfigMap's runtime_config.yaml."""
    tmp = tmp_path_factory.mktemp("k8s")
    (configmap,) = [d for _, d in DOCS if d["metadata"]["name"] == "sordino-config"]
    path = tmp / "runtime_config.yaml"
    path.write_text(configmap["data"]["runtime_config.yaml"], encoding="utf-8")
    config = load_config(path)
    local = config.model_copy(
        update={"server": config.server.model_copy(update={"data_dir": tmp / "data"})}
    )
    with serve_in_thread(local) as server:
        yield config, server


def test_probe_paths_answer_on_the_configured_server(configured: Any) -> None:
    _, server = configured
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert httpx.get(server.url + path, timeout=30).status_code == 200


def test_grace_period_covers_prestop_and_drain(configured: Any) -> None:
    config, _ = configured
    pod = kind("Deployment")["spec"]["template"]["spec"]
    pause = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pod["terminationGracePeriodSeconds"] >= pause + config.server.shutdown_timeout + 5
    args = flag_values(pod["containers"][0]["args"])
    assert args["--data-dir"] == config.server.data_dir.as_posix()
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "journal")
    assert mount["mountPath"] == args["--data-dir"] and mount["subPathExpr"] == "$(POD_NAME)"


def test_hpa_scales_on_a_metric_sordino_exports(configured: Any) -> None:
    _, server = configured
    hpa = kind("HorizontalPodAutoscaler")
    (metric,) = hpa["spec"]["metrics"]
    name = metric["pods"]["metric"]["name"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == kind("Deployment")["metadata"]["name"]
    (adapter,) = [d for _, d in DOCS if d["metadata"]["name"] == "prometheus-adapter-sordino"]
    rules = yaml.safe_load(adapter["data"]["config.yaml"])["rules"]
    assert any(rule["name"]["as"] == name for rule in rules)
    exported = httpx.get(server.url + "/metrics", timeout=30).text
    assert f"\n{name}{{" in exported or f"\n{name} " in exported


def test_dockerfile_is_slim_non_root_and_checks_health() -> None:
    text = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    lines = [line.strip() for line in text.splitlines() if line.strip() and line[0] != "#"]
    assert lines[0].startswith("FROM python:") and lines[0].endswith("-slim")
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1].split()[1].split(":")[0] not in ("0", "root")
    assert any(line.startswith("HEALTHCHECK") for line in lines)
    assert "/v2/health/live" in text
    cmd = [line for line in lines if line.startswith("CMD ")][-1]  # not HEALTHCHECK's
    flags = flag_values(yaml.safe_load(cmd.removeprefix("CMD ")))
    assert flags["--host"] == "0.0.0.0"
    assert f"127.0.0.1:{flags['--http-port']}/v2/health/live" in text
    assert f"EXPOSE {flags['--http-port']} {flags['--grpc-port']}" in lines
