"""The inference service: the one request path that every transport calls.

A decoded request is validated against its model, admitted (priority, deadline),
handed to the model's scheduler, which drives it step by step to its end. One-shot
(:meth:`InferenceService.infer`) and streaming (:meth:`InferenceService.responses`)
requests take the same way in (``_accept``) and out (``_finished``).

Every request that reaches the server is counted exactly once, with the same outcome,
in ``sordino_requests_total`` and ``sordino_tenant_requests_total``:

- one the transport could not read or decode (a bad body, an unknown model, the
  client gone mid-body, a server fault) is counted by :meth:`InferenceService.receiving`
  as ``rejected``;
- one refused by validation, admission or the queue, by ``_refused`` as ``rejected``;
- an accepted one by the scheduler (``sordino_requests_total``) and ``_finished``
  (the tenant family), both with the outcome the scheduler gave it.

Tensor ownership: the service owns the request's tensors until the scheduler accepts
them (a refused request is released here), and hands each response's outputs to the
transport, which calls :meth:`InferResponse.release` once it has encoded them. (A
binary request's tensors are views on the request body until the executor writes the
batch into the arena: one copy between the socket and the model.)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from types import TracebackType
from typing import Any

import numpy as np

from sordino.admission.chain import AdmissionChain, AdmissionContext
from sordino.admission.tenants import Tenants
from sordino.datatypes import to_numpy_dtype
from sordino.errors import (
    Cancelled,
    InvalidRequest,
    QueueTimeout,
    SordinoError,
    TensorError,
    Unsupported,
)
from sordino.execution.staging import row_bytes
from sordino.generation.pipeline import Progress
from sordino.generation.reuse import Generated
from sordino.inference import InferRequest, InferResponse, ModelKey, Tensor
from sordino.memory.quotas import QuotaLedger
from sordino.memory.refs import Tensors
from sordino.protocol.validate import check_text_inputs, validate_request
from sordino.records import Outcome
from sordino.scheduling.work import Request
from sordino.server.classification import classify
from sordino.server.registry import LoadedModel, ModelRegistry
from sordino.server.request_facts import request_facts
from sordino.server.sequences import Sequences
from sordino.telemetry.hub import Telemetry
from sordino.telemetry.metrics import Metrics
from sordino.telemetry.model_stats import ModelStats

__all__ = ["INTERNAL", "Arrival", "InferenceService", "request_tenant"]

INTERNAL = "internal"
"""The reason counted for a request that ended on an unexpected exception (a 500)."""


class Arrival:
    """What a transport knows of a request it is still reading: whom to count it for.

    Used as the context manager :meth:`InferenceService.receiving` returns (a class,
    not a generator: it wraps every request on the hot path).
    """

    __slots__ = ("_service", "model", "tenant", "version")

    def __init__(
        self, service: InferenceService, model: str, version: str | None, tenant: str | None
    ) -> None:
        self._service = service
        self.model = model
        self.version = version
        self.tenant = tenant

    def __enter__(self) -> Arrival:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc is None:
            return
        if isinstance(exc, SordinoError):
            reason = exc.reason
        elif isinstance(exc, asyncio.CancelledError):
            reason = Cancelled.reason
        elif isinstance(exc, Exception):
            reason = INTERNAL
        else:  # GeneratorExit, KeyboardInterrupt: not a request's end
            return
        self._service._count_rejected(self.model, self.version, self.tenant, reason)


class InferenceService:
    """Validates, admits, schedules and answers inference requests."""

    def __init__(
        self,
        registry: ModelRegistry,
        *,
        admission: AdmissionChain,
        priority_rules: dict[str, str | int],
        metrics: Metrics,
        stats: ModelStats,
        telemetry: Telemetry,
        quotas: QuotaLedger | None = None,
        learn: Callable[[str, int, int, float], None] | None = None,
        tenants: Tenants | None = None,
        pools: QuotaLedger | None = None,
    ) -> None:
        """``quotas`` charges each request's staged bytes to its tenant, ``pools`` to its
        model (the node pools, ``nodes[].runtime.memory_pool``); ``learn`` is told
        ``(model, rows, bytes, seconds)`` of every request that succeeded; ``tenants``
        authenticates requests and applies each tenant's limits."""
        self._registry = registry
        self._tenants = tenants
        self._quotas = quotas
        self._pools = pools
        self._learn = learn
        # id(request) -> (quota owner or None, pool owner or None, staged bytes, rows,
        # accepted at)
        self._tracked: dict[int, tuple[str | None, str | None, int, int, float]] = {}
        self._admission = admission
        self._priority_rules = priority_rules
        self._metrics = metrics
        self._stats = stats
        self._telemetry = telemetry

    def admit(self, request: InferRequest) -> tuple[LoadedModel, AdmissionContext]:
        """Find the model, validate ``request`` against it and run admission.

        Returns the model and the admission decisions (priority, deadline); raises the
        :class:`SordinoError` that refuses the request (and releases its tensors).
        Nothing is queued yet.
        """
        tenant = "default"
        try:
            tenant = self.tenant_of(request)
            model = self._registry.get(request.model, request.version)
            stream = model.metadata.stream
            if stream is not None and stream.state:
                _initial_state(request, model, stream.state)
            if model.pipeline is not None:
                model.pipeline.parse(request)  # the generator's own inputs; 400 on a mistake
            else:
                validate_request(request, model.metadata, max_batch_size=model.max_batch_size)
                check_text_inputs(request, model.metadata)
            context = self._admission.admit(
                request,
                AdmissionContext(
                    model=request.model,
                    settings=model.scheduling.queue,
                    priority_rules=self._priority_rules,
                    tenant=tenant,
                ),
            )
        except SordinoError as exc:
            if isinstance(exc, InvalidRequest) and self._tenants is not None:
                self._tenants.failed(tenant)  # bad inputs count towards the tenant's breaker
            self._refused(request, exc.reason)
            raise
        except Exception:
            self._refused(request, INTERNAL)
            raise
        return model, context

    def tenant_of(self, request: InferRequest) -> str:
        """The tenant ``request`` is served for (quotas, shared-memory regions, sequences).

        With tenants configured the key names it — a claimed ``parameters.tenant`` or
        ``X-Sordino-Tenant`` is dropped, and a wrong key raises 401 — and the answer is
        kept in ``parameters.tenant``; without, the claimed one, else ``default``. A
        model's call to another model (``internal_tenant``) is its caller's tenant.
        """
        tenants = self._tenants
        if request.internal_tenant is not None:  # a model's call (BLS): its caller's tenant
            request.parameters["tenant"] = request.internal_tenant
            return request.internal_tenant
        if tenants is None or not tenants.enabled:
            return _tenant(request)
        request.parameters.pop("tenant", None)
        request.headers.pop("x-sordino-tenant", None)
        tenant = tenants.authenticate(request.headers.get("authorization"))
        request.parameters["tenant"] = tenant
        return tenant

    def caller_tenant(self, headers: Mapping[str, str]) -> str:
        """The tenant of a call that is not an inference (shared-memory registration),
        from its HTTP headers or gRPC metadata, resolved as :meth:`tenant_of` does."""
        tenants = self._tenants
        if tenants is not None and tenants.enabled:
            return tenants.authenticate(headers.get("authorization"))
        tenant = headers.get("x-sordino-tenant")
        return tenant if tenant else "default"

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run a one-response request; return its response (the caller releases it).

        A streaming model is refused: its responses come from :meth:`responses`.
        """
        if self._generates(request):
            async with aclosing(self.generate(request, progress=False)) as answers:
                async for response, _final in answers:
                    return response
            raise AssertionError("a generation ends with a response")  # pragma: no cover
        sequences = self._sequences(request)
        if sequences is not None:
            tenant = self.tenant_of(request)
            return await sequences.run(
                request, tenant, self._infer_one, owner=self._sequence_owner(request, tenant)
            )
        return await self._infer_one(request)

    def _sequence_owner(self, request: InferRequest, tenant: str) -> str:
        """Whom a new sequence of ``request`` counts against: the tenant when the key
        names it; else the client address (a claimed tenant name is anyone's to claim)."""
        tenants = self._tenants
        if (tenants is not None and tenants.enabled) or request.client is None:
            return tenant
        return request.client

    def _sequences(self, request: InferRequest) -> Sequences | None:
        """The sequence batcher of ``request``'s model, if it has one (lookups fail later)."""
        try:
            return self._registry.get(request.model, request.version).sequences
        except SordinoError:
            return None

    async def _infer_one(self, request: InferRequest) -> InferResponse:
        model, context, accepted = await self._accept(request, one_shot=True)
        try:
            outputs = await model.scheduler.result(accepted)
        finally:
            self._finished(request, context, accepted)
        return self.response(model, request, outputs)

    async def responses(
        self, request: InferRequest
    ) -> AsyncGenerator[tuple[InferResponse, bool], None]:
        """Yield ``(response, final)`` for each response to ``request``; ``final`` marks the last.

        Validation and admission happen before the first step, so a refused request
        raises before anything is yielded. Errors of a later step raise from the
        iteration (the responses already yielded stand). Each yielded response is the
        reader's to release. A reader that stops early cancels the request; close the
        iterator (``contextlib.aclosing``) when leaving it early.
        """
        if self._generates(request):
            async with aclosing(self.generate(request, progress=True)) as answers:
                async for answer in answers:
                    yield answer
            return
        if self._sequences(request) is not None:
            yield await self.infer(request), True
            return
        model, context, accepted = await self._accept(request, one_shot=False)
        try:
            async with aclosing(model.scheduler.responses(accepted)) as steps:
                async for step in steps:
                    if step.empty:  # a decoupled request ended without a last response
                        step.outputs.release()
                        continue
                    yield self.response(model, request, step.outputs), step.final
        finally:
            self._finished(request, context, accepted)

    def _generates(self, request: InferRequest) -> bool:
        """True when ``request`` goes to an iterative model's generator.

        A lookup that fails is left to :meth:`admit`, which counts and raises it.
        """
        try:
            return self._registry.get(request.model, request.version).pipeline is not None
        except SordinoError:
            return False

    async def generate(
        self, request: InferRequest, *, progress: bool
    ) -> AsyncGenerator[tuple[InferResponse, bool], None]:
        """Answer a request to an iterative model: progress responses (when ``progress``),
        then the final one with ``image`` and ``png`` (``parameters.steps_used`` says how
        many denoising steps the image got).

        The steps run in the model's scheduler (counted there); a result from the cache
        or from an identical request in flight is counted here, for the tenant.
        """
        model, context = self.admit(request)
        pipeline = model.pipeline
        assert pipeline is not None
        params = pipeline.parse(request)
        request.release()  # the parsed values are all the generation needs
        outcome: Outcome = "cancelled"
        try:
            async with aclosing(
                pipeline.run(
                    params,
                    priority=context.priority,
                    timeout_s=context.timeout_s,
                    request_id=request.id,
                    progress=progress,
                )
            ) as answers:
                async for answer in answers:
                    if isinstance(answer, Progress):
                        yield self._progress_response(model, request, answer), False
                        continue
                    result, how = answer
                    outcome = "success"
                    if result.degraded:
                        self._telemetry.recent_requests.mark_degraded(request.id)
                    yield self._generated_response(model, request, result, how), True
        except SordinoError:
            outcome = "failure"
            raise
        finally:
            self._end_slot(context, outcome)
            self._telemetry.request_finished(
                request.model, _tenant(request), context.priority, outcome
            )

    def _progress_response(
        self, model: LoadedModel, request: InferRequest, progress: Progress
    ) -> InferResponse:
        return InferResponse(
            model=model.key.name,
            version=model.key.version,
            outputs=Tensors.of({"image": progress.preview}),
            output_datatypes={"image": "UINT8"},
            id=request.id,
            parameters={"step": progress.step, "steps": progress.steps},
        )

    def _generated_response(
        self, model: LoadedModel, request: InferRequest, result: Generated, how: str
    ) -> InferResponse:
        outputs: dict[str, Tensor] = {
            "image": result.image,
            "png": np.array(list(result.pngs) or [result.png], dtype=object),
        }
        if request.outputs:
            wanted = {o.name for o in request.outputs}
            outputs = {name: array for name, array in outputs.items() if name in wanted}
        return InferResponse(
            model=model.key.name,
            version=model.key.version,
            outputs=Tensors.of(outputs),
            output_datatypes={"image": "UINT8", "png": "BYTES"},
            id=request.id,
            parameters={
                "steps_used": result.steps_used,
                "steps_requested": result.steps_requested,
                "seed": result.seed,
                "degraded": result.degraded,
                "reused_steps": result.reused_steps,
                "cached_steps": result.cached_steps,
                "source": how,
            },
        )

    async def _accept(
        self, request: InferRequest, *, one_shot: bool
    ) -> tuple[LoadedModel, AdmissionContext, Request]:
        """Admit ``request`` and hand it to its model's scheduler (both ways in share this).

        With quotas, the request's bytes are charged to its tenant first (it may wait
        for room; 429 if none comes). Raises, having counted and released the request,
        when it is refused.
        """
        model, context = self.admit(request)
        if request.received_at is not None and context.timeout_s:
            # The deadline counts from arrival: the time spent waiting to be read and
            # decoded (an event loop behind under overload) is already gone.
            waited = time.monotonic() - request.received_at
            if waited >= context.timeout_s:
                late = QueueTimeout(
                    f"the request waited {waited * 1000:.0f} ms to be read, past its "
                    f"{context.timeout_s * 1000:.0f} ms deadline; it was not run. The server "
                    "is overloaded: retry later or raise the timeout"
                )
                self._end_slot(context, None)
                self._refused(request, late.reason)
                raise late
            context.timeout_s -= waited
        if one_shot and (model.metadata.stream is not None or model.metadata.decoupled):
            how = (
                "is decoupled (it sends any number of responses per request, as Triton's "
                "decoupled transaction policy); its inference endpoints are the streams"
                if model.metadata.decoupled
                else "streams its responses (one per step)"
            )
            error = Unsupported(
                f"model {model.key.name!r} {how}: use ModelStreamInfer over gRPC or POST "
                f"/v2/models/{model.key.name}/generate_stream over HTTP"
            )
            self._end_slot(context, None)
            self._refused(request, error.reason)
            raise error
        if self._quotas is not None or self._pools is not None or self._learn is not None:
            try:
                await self._charge(model, request)
            except BaseException:
                self._end_slot(context, None)
                raise
        try:
            # Fair share only among authenticated tenants (claimed names are free to invent).
            share = self._share(context)
            accepted = model.scheduler.submit(
                request.inputs,
                priority=context.priority,
                timeout_s=context.timeout_s,
                request_id=request.id,
                stream=model.metadata.stream,
                decoupled=model.metadata.decoupled,
                **share,
                owner=_tenant(request),
                # Built only for a backend that reads them (a Triton Python model).
                facts=request_facts(
                    request, context.priority, context.timeout_s, share.get("tenant")
                )
                if model.request_facts
                else None,
            )
        except SordinoError as exc:  # queue full, shutting down: never accepted
            self._end_slot(context, None)
            self._uncharge(request)
            self._refused(request, exc.reason)
            raise
        except Exception:
            self._end_slot(context, None)
            self._uncharge(request)
            self._refused(request, INTERNAL)
            raise
        return model, context, accepted

    async def _charge(self, model: LoadedModel, request: InferRequest) -> None:
        """Note the request's staged bytes; with quotas, charge its tenant (wait, or 429)."""
        inputs = request.inputs
        rows = 1
        if model.metadata.batched and inputs:
            rows = max(1, int(next(iter(inputs.values())).shape[0]))
        nbytes = rows * row_bytes(inputs, model.metadata)
        owner = pool = None
        try:
            if self._quotas is not None:
                owner = await self._quotas.acquire(_tenant(request), nbytes)
            if self._pools is not None:
                pool = await self._pools.acquire(model.key.name, nbytes)
        except BaseException as exc:
            if owner is not None and self._quotas is not None:
                self._quotas.release(owner, nbytes)
            reason = exc.reason if isinstance(exc, SordinoError) else Cancelled.reason
            self._refused(request, reason)
            raise
        self._tracked[id(request)] = (owner, pool, nbytes, rows, time.perf_counter())

    def _uncharge(self, request: InferRequest, *, succeeded: bool = False) -> None:
        tracked = self._tracked.pop(id(request), None)
        if tracked is None:
            return
        owner, pool, nbytes, rows, started = tracked
        if owner is not None and self._quotas is not None:
            self._quotas.release(owner, nbytes)
        if pool is not None and self._pools is not None:
            self._pools.release(pool, nbytes)
        if succeeded and self._learn is not None:
            self._learn(request.model, rows, nbytes, time.perf_counter() - started)

    def receiving(
        self, model: str = "", version: str | None = None, tenant: str | None = None
    ) -> Arrival:
        """Count a request that ends while its transport reads or decodes it.

        A transport wraps what it does between a request's arrival and :meth:`infer` or
        :meth:`responses` (reading the body, finding the model, decoding) in ``with``:
        whatever ends the request there is counted once as ``rejected`` — with the
        error's reason, ``cancelled`` when the task is cancelled, or ``internal`` for an
        unexpected exception — and raised on. The transport may fill in the
        :class:`Arrival` as it learns the model (gRPC: once the message is parsed).
        """
        return Arrival(self, model, version, tenant)

    def _finished(
        self, request: InferRequest, context: AdmissionContext, accepted: Request
    ) -> None:
        # The scheduler's outcome, which it also reported to sordino_requests_total: a
        # task cancelled after its request succeeded is a success in both.
        self._uncharge(request, succeeded=accepted.outcome == "success")
        outcome = accepted.outcome if accepted.outcome is not None else "cancelled"
        self._end_slot(context, outcome)
        self._telemetry.request_finished(request.model, _tenant(request), context.priority, outcome)

    def _share(self, context: AdmissionContext) -> dict[str, Any]:
        tenants = self._tenants
        if tenants is None or not tenants.enabled:
            return {}
        return {"tenant": context.tenant, "weight": tenants.weight(context.tenant)}

    def _end_slot(self, context: AdmissionContext, outcome: str | None) -> None:
        """Give back the tenant slot ``context`` holds; ``outcome`` feeds its breaker."""
        if context.slot and self._tenants is not None:
            self._tenants.finished(context, outcome)

    def _refused(self, request: InferRequest, reason: str) -> None:
        request.release()
        self._count_rejected(request.model, request.version, _tenant(request), reason)

    def refused_unread(
        self, model: str, version: str | None, tenant: str | None, reason: str, count: int = 1
    ) -> None:
        """Count ``count`` requests a transport refused unread for ``reason``.

        As :meth:`receiving` counts a request that ends while it is read.
        """
        self._count_rejected(model, version, tenant, reason, count)

    def _count_rejected(
        self, model: str, version: str | None, tenant: str | None, reason: str, count: int = 1
    ) -> None:
        # Only a loaded version is a label value; an unknown one is the client's string.
        versions = self._registry.versions(model)
        if version:
            served = version if version in versions else ""
        else:
            served = versions[-1] if versions else ""
        self._metrics.request_rejected(model, reason, version=served, count=count)
        self._telemetry.request_finished(model, tenant or "default", 0, "rejected", count)
        loaded = ModelKey(model, served) if served else None
        self._telemetry.request_rejected(loaded, model, reason, count)

    def response(
        self, model: LoadedModel, request: InferRequest, outputs: Tensors
    ) -> InferResponse:
        """The response to ``request``: the outputs it asked for (it owns ``outputs``)."""
        picked = outputs
        if request.outputs:
            wanted = {o.name for o in request.outputs}
            chosen = {
                spec.name: (outputs, spec.name)
                for spec in model.metadata.outputs
                if spec.name in wanted
            }
            if len(chosen) < len(outputs):
                picked = Tensors.compose(chosen)
                outputs.release()
        datatypes = {spec.name: spec.datatype for spec in model.metadata.outputs}
        if request.outputs and any("classification" in o.parameters for o in request.outputs):
            picked, datatypes = classify(
                request, picked, datatypes, model.labels, batched=model.metadata.batched
            )
        return InferResponse(
            model=model.key.name,
            version=model.key.version,
            outputs=picked,
            output_datatypes=datatypes,
            id=request.id,
        )

    def triton_statistics(self, name: str | None = None, version: str | None = None) -> Any:
        """Return Triton's statistics-extension JSON for one model or all of them."""
        if name is None:
            keys = [m.key for m in self._registry.models()]
        elif version:
            keys = [self._registry.get(name, version).key]
        else:
            self._registry.get(name)
            keys = [ModelKey(name, v) for v in self._registry.versions(name)]
        return self._stats.triton_json(keys)


def _initial_state(request: InferRequest, model: LoadedModel, names: tuple[str, ...]) -> None:
    """Give a step model's state inputs (fed by its carry, never by the client) zeros."""
    inputs = dict(request.inputs)
    rows = 1
    if model.metadata.batched and inputs:
        rows = int(next(iter(inputs.values())).shape[0])
    for name in names:
        if name in inputs:
            raise TensorError(
                f"input {name!r} of model {model.key.name!r} is the model's own state (fed "
                "from its previous step); leave it out of the request"
            )
        spec = model.metadata.input(name)
        assert spec is not None  # checked at load
        shape = [max(dim, 1) for dim in spec.shape]
        if model.metadata.batched:
            shape[0] = rows
        inputs[name] = np.zeros(shape, dtype=to_numpy_dtype(spec.datatype))
        request.input_datatypes[name] = spec.datatype
    request.inputs = inputs


def request_tenant(request: InferRequest) -> str:
    """The tenant ``request`` is served for (what quotas and shared-memory regions key on)."""
    return _tenant(request)


def _tenant(request: InferRequest) -> str:
    tenant = request.parameters.get("tenant") or request.headers.get("x-sordino-tenant")
    return tenant if isinstance(tenant, str) and tenant else "default"
