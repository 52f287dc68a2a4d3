"""Wiring the guardian into a runtime, and the deep health check it (and /health) runs.

:func:`open_guardian` gives the guardian's actions their controls — the executor, the
admission gate, the memory manager (``runtime.memory``) and the step degrader
(``runtime.step_degrader``) when this build has them — and refuses at start-up a
trigger this build cannot serve. :func:`deep_health` runs one real one-row inference
per loaded model.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from sordino.backends.base import dummy_inputs
from sordino.config.units import parse_duration
from sordino.control.admin import AdminAccess
from sordino.errors import ConfigError, InvalidRequest, SordinoError
from sordino.guardian import (
    SUPPORTED,
    AlertSender,
    Controls,
    Defragmenter,
    Guardian,
    Recovery,
    StepDegrader,
    build_action,
    check_supported,
)
from sordino.inference import ModelKey
from sordino.protocol.encode import encode_json
from sordino.server.pipelines import PipelineExecutor
from sordino.server.registry import LoadedModel
from sordino.telemetry.journal_reader import JournalReader, MissingJournal

if TYPE_CHECKING:
    from sordino.server.runtime import Runtime

__all__ = [
    "deep_health",
    "guarded_models",
    "guardian_routes",
    "health_response",
    "not_ready",
    "not_serving",
    "open_guardian",
    "server_ready",
    "unready",
    "versions_ready",
    "wedged",
]

log = logging.getLogger("sordino.guardian")

DEEP_HEALTH_TIMEOUT_S = 10.0


async def deep_health(runtime: Runtime, timeout_s: float = DEEP_HEALTH_TIMEOUT_S) -> dict[str, str]:
    """Run one zero-filled one-row inference per loaded model; return the failing ones.

    The result maps ``name/version`` to why it failed (an empty dict: every model
    served). The batches take the real path through the executor (staging, a worker,
    the fallback chain), not the scheduler's queue.
    """
    models = runtime.models()

    async def probe(model: LoadedModel) -> str | None:
        key = model.key
        # A pipeline has no instances: its own executor runs the inference through the
        # models it chains (it failed as "no loaded instance" before).
        executor = model.scheduler.executor
        if isinstance(executor, PipelineExecutor):
            run = executor.run(key, [dummy_inputs(model.metadata, 1)])
        else:
            run = runtime.executor.run(key, [dummy_inputs(runtime.executor.metadata(key), 1)])
        try:
            outputs = await asyncio.wait_for(run, timeout_s)
        except TimeoutError:
            return f"no answer within {timeout_s:g} s"
        except Exception as exc:
            return str(exc) or type(exc).__name__
        outputs.release()
        return None

    results = await asyncio.gather(*(probe(m) for m in models))
    return {str(m.key): r for m, r in zip(models, results, strict=True) if r is not None}


def not_serving(runtime: Runtime) -> list[str]:
    """The loaded models none of whose instances can take a batch now; a pipeline (an
    ensemble) is one of them when a model it runs is, or is not loaded. (A pipeline has
    no instances: counting its own, every server with one was never ready.)"""
    pipelines = {p.key for p in runtime.pipelines}
    down = {
        m.key
        for m in runtime.models()
        if m.key not in pipelines and runtime.executor.serving(m.key) == 0
    }
    for pipeline in runtime.pipelines:  # built inner first: an inner one is judged before
        executor = pipeline.scheduler.executor
        if isinstance(executor, PipelineExecutor) and any(
            (key := _served_key(runtime, node.model)) is None or key in down
            for node in executor.config.nodes
        ):
            down.add(pipeline.key)
    return [str(m.key) for m in runtime.models() if m.key in down]


def guarded_models(runtime: Runtime, excluded: set[str]) -> list[ModelKey]:
    """The served models the guardian's actions act on: not ``excluded``, and not the
    pipelines, which have no instance to restart or scale (their models are acted on;
    with a pipeline counted, "the only model" of a one-model server was never found)."""
    pipelines = {p.key for p in runtime.pipelines}
    return [
        m.key for m in runtime.models() if m.key.name not in excluded and m.key not in pipelines
    ]


def _served_key(runtime: Runtime, name: str) -> ModelKey | None:
    """The version a request for ``name`` runs, None if none is served."""
    try:
        return runtime.registry.get(name).key
    except SordinoError:
        return None


def wedged(runtime: Runtime) -> dict[str, str]:
    """The loaded models with a batch running longer than any batch may, and why.

    A batch lives at most: the wait for arena space (``memory.overflow_wait``), its
    run (``workers.execution_timeout``) and, when its instance is lost, a restart
    (``workers.start_timeout``) and a second run. A batch older than that waits on
    something that will not come; readiness then says not ready (issue 27: the
    engine served nothing while ``/v2/health/ready`` answered 200). Without an
    execution timeout (0) there is no such bound and nothing is called wedged.
    """
    config = runtime.config
    workers = config.workers
    if not workers.execution_timeout:
        return {}
    bound = config.memory.overflow_wait + 2 * workers.execution_timeout + workers.start_timeout
    found = {}
    for model in runtime.registry.models():
        running = model.scheduler.running_for()
        if running > bound:
            found[str(model.key)] = (
                f"{model.key} is wedged: a batch has been running for {running:.0f} s, "
                "longer than any may "
                f"({bound:g} s: memory.overflow_wait + 2 x workers.execution_timeout + "
                "workers.start_timeout)"
            )
    return found


def unready(runtime: Runtime) -> dict[str, str]:
    """The loaded models that cannot serve now, and why: no instance can take a batch
    (all restarting), or a batch has run longer than any may (:func:`wedged`).
    Readiness (HTTP and gRPC) is this being empty while the runtime is ready."""
    failing = {key: f"no instance can serve {key}" for key in not_serving(runtime)}
    for key, reason in wedged(runtime).items():
        failing.setdefault(key, reason)
    return failing


async def not_ready(runtime: Runtime, asked: Iterable[ModelKey] | None = None) -> dict[str, str]:
    """The loaded models that are not ready, and why: :func:`unready`'s, and those of
    ``asked`` (default: every model) whose own check says no (a Triton Python model's
    ``is_ready()``; ``ChainExecutor.readiness``). Readiness (HTTP, gRPC, ``/health``)
    is this being empty while the runtime is ready.

    A pipeline (an ensemble) is not made unready by its steps' own checks, as on Triton
    (whose ensembles have no check of their own).
    """
    found = unready(runtime)
    keys = [m.key for m in runtime.models()] if asked is None else list(asked)
    keys = [key for key in dict.fromkeys(keys) if str(key) not in found]
    answers = await asyncio.gather(*(runtime.executor.readiness(key) for key in keys))
    for key, why in zip(keys, answers, strict=True):
        if why is not None:
            found[str(key)] = f"{key} says it is not ready ({why})"
    return found


async def server_ready(runtime: Runtime) -> bool:
    """The server's readiness, as ``/v2/health/ready`` and ``ServerReady`` answer it:
    serving, no model left out at start while readiness is strict
    (:meth:`Runtime.left_out`), and no loaded model in :func:`not_ready`."""
    return runtime.ready and not runtime.left_out() and not await not_ready(runtime)


async def versions_ready(runtime: Runtime, name: str, version: str = "") -> bool:
    """Whether no loaded version of model ``name`` (``version`` alone when given) is in
    :func:`not_ready` — whether it is loaded at all is the caller's to ask."""
    asked = [
        m.key
        for m in runtime.models()
        if m.key.name == name and (not version or m.key.version == version)
    ]
    down = await not_ready(runtime, asked)
    return not any(str(key) in down for key in asked)


class _WorstInstance:
    """The instance of a model that failed most since it was last picked (restarted)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._baseline: dict[tuple[ModelKey, int], int] = {}

    def __call__(self, key: ModelKey) -> int | None:
        workers = [
            w
            for w in self._runtime.executor.statistics().workers
            if w.model == key.name and w.version == key.version and w.isolation == "process"
        ]
        if not workers:
            return None
        worst = max(
            workers, key=lambda w: (w.failures - self._baseline.get((key, w.index), 0), -w.index)
        )
        self._baseline[(key, worst.index)] = worst.failures
        return worst.index


def open_guardian(runtime: Runtime) -> Guardian:
    """Build the guardian of ``runtime`` (not started); ConfigError for what cannot run."""
    config = runtime.config.guardian  # self_healing, with the nodes' own applied
    for trigger in config.triggers:
        metric = trigger.metric
        if metric.startswith("latency_p"):
            metric = f"p{metric.removeprefix('latency_p')}_latency"
        if metric not in SUPPORTED:
            raise ConfigError(
                f"self_healing: the metric {trigger.metric} is not supported in this build "
                f"(measured: {', '.join(sorted(SUPPORTED))})"
            )
    kept = runtime.config.telemetry.recent_window
    for trigger in config.triggers:
        needed = max(trigger.window_s, trigger.verify_s) * (
            2 if trigger.parsed_threshold().change else 1
        )
        if needed > kept:
            raise ConfigError(
                f"self_healing: the trigger '{trigger.name}' needs {needed:g} s of series "
                f"but the server keeps {kept:g} s in memory: shorten its window or raise "
                "telemetry.recent_window"
            )
    if not config.triggers:
        log.warning("the guardian is on but self_healing.triggers is empty: it has nothing to do")
    # The request timings are recorded only when a trigger reads them.
    runtime.timings.enabled = any(
        t.metric in ("network_latency", "frame_delay") for t in config.triggers
    )
    alerts = (
        AlertSender(config.alert_channels, clock=runtime.clock) if config.alert_channels else None
    )

    async def health(key: ModelKey) -> str | None:
        failing = await deep_health(runtime)
        return failing.get(str(key))

    recovery = Recovery(
        config.recovery,
        executor=runtime.executor,
        health=health,
        clock=runtime.clock,
        events=runtime.events,
        start_timeout_s=runtime.config.workers.start_timeout,
    )
    excluded = set(config.exclude_models)  # nodes with self_healing: false
    # What other parts provide when this build has them (the memory manager, the
    # diffusion models' step degrader); an object without the method does not count.
    memory = getattr(runtime, "memory", None)
    degrader = getattr(runtime, "step_degrader", None)
    controls = Controls(
        executor=runtime.executor,
        gate=runtime.gate,
        config=config,
        models=lambda: guarded_models(runtime, excluded),
        worst_instance=_WorstInstance(runtime),
        defragmenter=memory if isinstance(memory, Defragmenter) else None,
        step_degrader=degrader if isinstance(degrader, StepDegrader) else None,
        result_cache=runtime.result_cache,
        recover=recovery,
    )
    for trigger in config.triggers:
        for spec in trigger.parsed_actions():
            check_supported(spec, controls)
    return Guardian(
        config,
        series=runtime.telemetry.series,
        make_action=lambda spec, model: build_action(spec, model, controls),
        events=runtime.events,
        clock=runtime.clock,
        alerts=alerts,
        timings=runtime.timings.recent,
    )


def _event_json(
    t: float, kind: str, subject: str, cause: str, payload: dict[str, Any]
) -> dict[str, Any]:
    return {"t": t, "kind": kind, "subject": subject, "cause": cause, "payload": payload}


def _journal_events(
    path: Path, since: float, until: float, kind: str | None
) -> list[dict[str, Any]]:
    """Journaled events with ``since < t < until`` (of ``kind``), oldest first."""
    try:
        with JournalReader(path) as reader:
            window = reader.window(since, until)
    except MissingJournal:
        return []
    return [
        _event_json(e.t, e.kind, e.subject, e.cause, e.payload)
        for e in window.events
        if (kind is None or e.kind == kind) and since < e.t < until
    ]


def guardian_routes(runtime: Runtime, guard: Any, access: AdminAccess) -> list[Route]:
    """``/health``, ``/v2/sordino/guardian`` and ``/v2/sordino/events``."""

    async def health(request: Request) -> Response:
        return await health_response(runtime, request)

    async def status(request: Request) -> Response:
        guardian = runtime.guardian
        if guardian is None:
            return _json({"enabled": False, "gate": asdict(runtime.gate.statistics())})
        document = asdict(guardian.statistics())
        document["gate"] = asdict(runtime.gate.statistics())
        return _json(document)

    async def events(request: Request) -> Response:
        raw = request.query_params.get("since", "3600")
        after = request.query_params.get("after")
        try:
            since = float(after) if after is not None else time.time() - parse_duration(raw)
        except (ConfigError, ValueError):
            raise InvalidRequest(
                f"since {raw!r} is not a duration (e.g. 1h, 30m) or after is not a time"
            ) from None
        kind = request.query_params.get("kind") or None
        # The sink keeps the last events only; older ones are read back from the journal.
        kept = runtime.events.recent()
        found = [
            _event_json(e.time, e.kind, e.subject, e.cause, e.payload)
            for e in kept
            if e.time > since and (kind is None or e.kind == kind)
        ]
        journal = runtime.telemetry.journal
        if journal is not None and kept and kept[0].time > since:
            loop = asyncio.get_running_loop()
            older = await loop.run_in_executor(
                None, _journal_events, journal.path, since, kept[0].time, kind
            )
            found = older + found
        return _json({"events": found[-5000:]})

    return [
        Route("/health", guard(health), methods=["GET"]),
        Route("/v2/sordino/guardian", guard(access.protect(status)), methods=["GET"]),
        Route("/v2/sordino/events", guard(access.protect(events)), methods=["GET"]),
    ]


async def health_response(runtime: Runtime, request: Request) -> Response:
    """200 when ready (and, with ``?deep=true``, every model served one inference), else 503."""
    deep = request.query_params.get("deep", "false").lower() in ("1", "true", "yes")
    if not runtime.ready:
        return _json({"ready": False, "reason": "the server is not serving"}, 503)
    left = runtime.left_out()
    if left:  # server.strict_readiness
        reason = "; ".join(f"model {name} was left out at start: {e}" for name, e in left.items())
        return _json({"ready": False, "reason": reason, "left_out": left}, 503)
    down = await not_ready(runtime)
    if down:
        reason = "; ".join(down.values())
        return _json({"ready": False, "reason": reason, "failing": down}, 503)
    if not deep:
        return _json({"ready": True})
    failing = await deep_health(runtime)
    models = [str(m.key) for m in runtime.models()]
    body = {"ready": not failing, "models": models, "failing": failing}
    return _json(body, 503 if failing else 200)


def _json(obj: object, status: int = 200) -> Response:
    return Response(encode_json(obj), status_code=status, media_type="application/json")
