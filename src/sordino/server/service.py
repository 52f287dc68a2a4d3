"""The inference service: the one request path that every transport calls.

A request goes through it in one pass: the transport looks up its :class:`Route` once
(the model version; an unknown model is 404 before the body is decoded) and hands it
over with the decoded request; the request is authenticated once (its tenant is kept
on it), validated against the model, admitted (priority and deadline, the one place
they are computed: ``admission/chain.py``), and handed to the model's scheduler,
which drives it step by step to its end. One-shot (:meth:`InferenceService.infer`)
and streaming (:meth:`InferenceService.responses`) requests take the same way in
(``_accept``); what an admitted request holds — its tenant's slot, its charged bytes —
is a :class:`~sordino.server.ticket.Ticket`, given back once however it ends.

Every request that reaches the server is counted exactly once, with the same outcome,
in ``sordino_requests_total`` and ``sordino_tenant_requests_total``:

- one the transport could not read or decode (a bad body, an unknown model, the
  client gone mid-body, a server fault) is counted by :meth:`InferenceService.receiving`
  as ``rejected``;
- one refused by validation, admission or the queue, as ``rejected`` with its reason
  (``server/counting.py``);
- an accepted one by the scheduler (``sordino_requests_total``) and its ticket (the
  tenant family), both with the outcome the scheduler gave it.

Tensor ownership: the service owns the request's tensors until the scheduler accepts
them (a refused request is released here), and hands each response's outputs to the
transport, which calls :meth:`InferResponse.release` once it has encoded them. (A
binary request's tensors are views on the request body until the executor writes the
batch into the arena: one copy between the socket and the model.)
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator, Callable, Mapping
from contextlib import aclosing
from functools import partial
from typing import Any

from sordino.admission.chain import AdmissionChain, AdmissionContext
from sordino.admission.tenants import Tenants
from sordino.errors import InvalidRequest, Replaced, SordinoError
from sordino.generation.pipeline import Progress
from sordino.inference import InferRequest, InferResponse
from sordino.memory.quotas import QuotaLedger
from sordino.memory.refs import Tensors
from sordino.protocol.validate import check_text_inputs, validate_request
from sordino.records import Outcome
from sordino.scheduling.work import Request
from sordino.server import answers
from sordino.server.counting import INTERNAL, Arrival, Rejections, reason_of, request_tenant
from sordino.server.infer_soon import Soon
from sordino.server.registry import ModelRegistry
from sordino.server.request_facts import request_facts
from sordino.server.response_cache import ResponseCache
from sordino.server.route import Route, fill_initial_state, refuse_one_shot
from sordino.server.sequences import sequence_owner
from sordino.server.ticket import Ticket, Tickets
from sordino.server.tracing import Trace, Tracer, traced
from sordino.telemetry.hub import Telemetry
from sordino.telemetry.metrics import Metrics
from sordino.telemetry.model_stats import ModelStats

__all__ = ["INTERNAL", "Arrival", "InferenceService", "Soon", "request_tenant"]


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
        response_cache: ResponseCache | None = None,
    ) -> None:
        """``quotas`` charges each request's staged bytes to its tenant, ``pools`` to its
        model (the node pools, ``nodes[].runtime.memory_pool``); ``learn`` is told
        ``(model, rows, bytes, seconds)`` of every request that succeeded; ``tenants``
        authenticates requests and applies each tenant's limits; ``response_cache`` keeps
        the answers of the models that enable it."""
        self._registry = registry
        self._tenants = tenants
        self._admission = admission
        self._priority_rules = priority_rules
        self._stats = stats
        self._telemetry = telemetry
        self._rejections = Rejections(registry, metrics, telemetry)
        self._tickets = Tickets(telemetry, tenants=tenants, quotas=quotas, pools=pools, learn=learn)
        self._cache = response_cache
        self.tracer = Tracer.off()
        """Triton's request tracing (``server/tracing.py``); the runtime sets its own."""

    # -- the way in ------------------------------------------------------------------

    def admit(self, request: InferRequest, route: Route) -> AdmissionContext:
        """Validate ``request`` against its model and run admission.

        Returns the admission decisions (priority, deadline, tenant slot); raises the
        :class:`SordinoError` that refuses the request, having counted it and released
        its tensors. Nothing is queued yet.
        """
        tenant = "default"
        try:
            tenant = self.tenant_of(request)
            model = route.model
            metadata = route.metadata
            stream = metadata.stream
            if stream is not None and stream.state:
                fill_initial_state(request, route, stream.state)
            if model.pipeline is not None:
                model.pipeline.parse(request)  # the generator's own inputs; 400 on a mistake
            else:
                validate_request(request, metadata, max_batch_size=route.max_batch_size)
                check_text_inputs(request, metadata)
            return self._admission.admit(
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
            self._rejections.refused(request, exc.reason)
            raise
        except Exception:
            self._rejections.refused(request, INTERNAL)
            raise

    def tenant_of(self, request: InferRequest, known: str | None = None) -> str:
        """The tenant ``request`` is served for (quotas, shared-memory regions, sequences).

        With tenants configured the key names it — a claimed ``parameters.tenant`` or
        ``X-Sordino-Tenant`` is dropped, and a wrong key raises 401 — and the answer is
        kept in ``parameters.tenant`` and ``request.tenant``, so the key is hashed once
        a request (``known``: the tenant the transport already authenticated it as);
        without, the claimed one, else ``default``. A model's call to another model
        (``internal_tenant``, BLS) is its caller's tenant.
        """
        if request.tenant is not None:
            return request.tenant
        if request.internal_tenant is not None:  # a model's call (BLS): its caller's tenant
            request.parameters["tenant"] = request.tenant = request.internal_tenant
            return request.internal_tenant
        tenants = self._tenants
        if tenants is None or not tenants.enabled:
            return request_tenant(request)
        request.parameters.pop("tenant", None)
        request.headers.pop("x-sordino-tenant", None)
        if known is None:
            known = tenants.authenticate(request.headers.get("authorization"))
        request.parameters["tenant"] = request.tenant = known
        return known

    def caller_tenant(self, headers: Mapping[str, str]) -> str:
        """The tenant of a call that is not an inference (shared-memory registration),
        from its HTTP headers or gRPC metadata, resolved as :meth:`tenant_of` does."""
        tenants = self._tenants
        if tenants is not None and tenants.enabled:
            return tenants.authenticate(headers.get("authorization"))
        tenant = headers.get("x-sordino-tenant")
        return tenant if tenant else "default"

    def _route(self, request: InferRequest, route: Route | None) -> Route:
        """``route`` if the transport found it, else looked up here (counted if refused;
        a wrong key is told before whether the model exists)."""
        if route is not None:
            return route
        try:
            self.tenant_of(request)
            return self._registry.route(request.model, request.version)
        except BaseException as exc:
            reason = reason_of(exc)
            if reason is not None:
                self._rejections.refused(request, reason)
            raise

    async def _accept(
        self, request: InferRequest, route: Route, *, one_shot: bool
    ) -> tuple[Request, Ticket]:
        """Admit ``request`` and hand it to its model's scheduler (both ways in share this).

        With quotas, the request's bytes are charged to its tenant first (it may wait
        for room; 429 if none comes). Raises, having counted and released the request
        and given back its ticket, when it is refused.
        """
        _hold_as_tensors(request)
        context = self.admit(request, route)
        ticket = self._tickets.issue(request.model, context)
        try:
            if one_shot:
                refuse_one_shot(route)
            if self._tickets.waits:
                await ticket.charge(route, request)
            return self._submit(request, route, context, ticket), ticket
        except BaseException as exc:  # never accepted: the inputs are still ours
            self._unaccepted(request, ticket, exc)
            raise

    def _accept_now(self, request: InferRequest, route: Route) -> tuple[Request, Ticket]:
        """:meth:`_accept` of a one-shot request where no charge waits (``not waits``)."""
        _hold_as_tensors(request)
        context = self.admit(request, route)
        ticket = self._tickets.issue(request.model, context)
        try:
            refuse_one_shot(route)
            return self._submit(request, route, context, ticket), ticket
        except BaseException as exc:
            self._unaccepted(request, ticket, exc)
            raise

    def _submit(
        self, request: InferRequest, route: Route, context: AdmissionContext, ticket: Ticket
    ) -> Request:
        if self._tickets.charging and not self._tickets.waits:
            ticket.weigh(route, request)  # no quota to wait on: no coroutine
        # Fair share only among authenticated tenants (claimed names are free to invent).
        share, weight = "", 1
        tenants = self._tenants
        if tenants is not None and tenants.enabled:
            share, weight = context.tenant, tenants.weight(context.tenant)
        return route.scheduler.submit(
            request.inputs,
            priority=context.priority,
            timeout_s=context.timeout_s,
            request_id=request.id,
            stream=route.metadata.stream,
            decoupled=route.metadata.decoupled,
            again=request.again,
            tenant=share,
            weight=weight,
            owner=context.tenant,
            # Built only for a backend that reads them (a Triton Python model).
            facts=request_facts(request, context.priority, context.timeout_s, share or None)
            if route.model.request_facts
            else None,
        )

    def _unaccepted(self, request: InferRequest, ticket: Ticket, exc: BaseException) -> None:
        ticket.release(None)
        reason = reason_of(exc)
        if reason is not None and not isinstance(exc, Replaced):  # asked again
            self._rejections.refused(request, reason)

    # -- the ways through --------------------------------------------------------------

    async def infer(self, request: InferRequest, route: Route | None = None) -> InferResponse:
        """Run a one-response request; return its response (the caller releases it).

        ``route`` is the request's model version when the transport already found it.
        A streaming model is refused: its responses come from :meth:`responses`.
        """
        route = self._route(request, route)
        way = route.way
        if way == "generate":
            async with aclosing(self.generate(request, route, progress=False)) as answered:
                async for response, _final in answered:
                    return response
            raise AssertionError("a generation ends with a response")  # pragma: no cover
        if way == "sequence":
            sequences = route.model.sequences
            assert sequences is not None
            try:
                tenant = self.tenant_of(request)
            except SordinoError as exc:  # a wrong key: refused before the sequence is touched
                self._rejections.refused(request, exc.reason)
                raise
            one = partial(self._infer_one, route=route)
            tenanted = self._tenants is not None and self._tenants.enabled
            owner = sequence_owner(request, tenant, tenanted=tenanted)
            return await sequences.run(request, tenant, one, owner=owner)
        try:
            return await self._infer_one(request, route)
        except Replaced:  # reloaded between its lookup and its queue (not accepted)
            return await self._infer_one(request, self._route(request, None))

    async def _infer_one(
        self, request: InferRequest, route: Route, trace: Trace | None = None
    ) -> InferResponse:
        cache = self._cache if route.cached else None
        if cache is not None:
            return await self._infer_cached(request, route, cache)
        tracer = self.tracer
        if trace is None and tracer.on:
            trace = tracer.sample(route.key.name, route.key.version, request.id)
            if trace is not None:
                return await traced(self._infer_one, request, route, trace)
        accepted, ticket = await self._accept(request, route, one_shot=True)
        if trace is not None:
            accepted.trace = trace
            trace.stamp("QUEUE_START")
        try:
            outputs = await route.scheduler.result(accepted)
        finally:
            # The scheduler's outcome, which it also counted in sordino_requests_total: a
            # task cancelled after its request succeeded is a success in both.
            ticket.release(accepted.outcome or "cancelled")
        return answers.response(route, request, outputs)

    async def _infer_cached(
        self, request: InferRequest, route: Route, cache: ResponseCache
    ) -> InferResponse:
        """:meth:`_infer_one` of a model whose answers the response cache keeps: a
        request is validated and admitted as any other, then answered from the cache
        when its inputs were answered before; else run, and its answer kept."""
        started = time.perf_counter()
        _hold_as_tensors(request)
        inputs = request.inputs
        assert isinstance(inputs, Tensors)
        key = cache.key(route.key, inputs)
        if cache.holds(key):  # admitted first: a refused request is no hit
            context = self.admit(request, route)
            kept = cache.get(key)
            assert kept is not None  # (nothing ran in between)
            self._tickets.issue(request.model, context).release("success")
            request.release()
            elapsed = time.perf_counter() - started
            self._stats.cache_looked_up(route.key, hit=True, seconds=elapsed)
            route.scheduler.answered_from_cache(context.priority, elapsed, request.id)
            return answers.response(route, request, kept)
        cache.get(key)  # the miss, counted
        spent = time.perf_counter() - started
        # (As _infer_one, in other words: bench/trace_c1.py marks that one's lines.)
        try:
            queued, held = await self._accept(request, route, one_shot=True)
            try:
                answer = await route.scheduler.result(queued)
            finally:
                held.release(queued.outcome or "cancelled")
            started = time.perf_counter()
            cache.put(route.key, key, answer)
            spent += time.perf_counter() - started
        finally:  # a miss, answered or not (the lookup's time, and the insertion's)
            self._stats.cache_looked_up(route.key, hit=False, seconds=spent)
        return answers.response(route, request, answer)

    def infer_soon(
        self, request: InferRequest, route: Route, done: Callable[[InferResponse | Exception], None]
    ) -> Soon | None:
        """:meth:`infer` without a task, for a transport that answers by callback: the
        request is admitted and queued now (a refusal raises here, counted, as from
        :meth:`infer`) and ``done`` is called once with its response (the callee
        releases it) or its error; :meth:`Soon.cancel` cancels it (``done`` is then not
        called). None, having done nothing, for a request that must wait in :meth:`infer`
        (a generation, a sequence, a streaming model, a quota that may wait, tracing on;
        or its version was reloaded since the transport looked it up).
        """
        if route.way != "infer" or self._tickets.waits or self.tracer.on:
            return None
        if route.cached and self._cache:
            return None
        try:
            accepted, ticket = self._accept_now(request, route)
        except Replaced:  # reloaded before it queued: infer() asks the new load
            return None
        return Soon(route, request, accepted, ticket, done)

    async def responses(
        self, request: InferRequest, route: Route | None = None
    ) -> AsyncGenerator[tuple[InferResponse | SordinoError, bool], None]:
        """Yield ``(response, final)`` for each response to ``request``; ``final`` marks the last.

        Validation and admission happen before the first step, so a refused request
        raises before anything is yielded. Errors of a later step raise from the
        iteration (the responses already yielded stand). A decoupled model's error
        response that is not its last is yielded as the error (``final`` false; the
        stream goes on, as on Triton). Each yielded response is the reader's to release.
        A reader that stops early cancels the request; close the iterator
        (``contextlib.aclosing``) when leaving it early.
        """
        route = self._route(request, route)
        if route.way == "generate":
            async with aclosing(self.generate(request, route, progress=True)) as answered:
                async for answer in answered:
                    yield answer
            return
        if route.way == "sequence" and not route.metadata.decoupled:
            yield await self.infer(request, route), True
            return
        if route.way == "sequence":  # an iterative sequence's stream (sequences_for)
            assert route.model.sequences is not None
            route.model.sequences.own(request)
        try:
            accepted, ticket = await self._accept(request, route, one_shot=False)
        except Replaced:  # reloaded between its lookup and its queue (not accepted)
            route = self._route(request, None)
            accepted, ticket = await self._accept(request, route, one_shot=False)
        try:
            async with aclosing(route.scheduler.responses(accepted)) as steps:
                async for step in steps:
                    if step.error is not None:
                        step.outputs.release()  # none: the step is the model's error
                        yield step.error, False
                        continue
                    if step.empty:  # a decoupled request ended without a last response
                        step.outputs.release()
                        continue
                    yield answers.response(route, request, step.outputs), step.final
        finally:
            ticket.release(accepted.outcome or "cancelled")

    async def generate(
        self, request: InferRequest, route: Route | None = None, *, progress: bool
    ) -> AsyncGenerator[tuple[InferResponse, bool], None]:
        """Answer a request to an iterative model: progress responses (when ``progress``),
        then the final one with ``image`` and ``png`` (``parameters.steps_used`` says how
        many denoising steps the image got).

        The steps run in the model's scheduler (counted there); a result from the cache
        or from an identical request in flight is counted here, for the tenant.
        """
        route = self._route(request, route)
        context = self.admit(request, route)
        ticket = self._tickets.issue(request.model, context)
        pipeline = route.model.pipeline
        assert pipeline is not None
        outcome: Outcome = "cancelled"
        try:
            params = pipeline.parse(request)
            request.release()  # the parsed values are all the generation needs
            async with aclosing(
                pipeline.run(
                    params,
                    priority=context.priority,
                    timeout_s=context.timeout_s,
                    request_id=request.id,
                    progress=progress,
                )
            ) as answered:
                async for answer in answered:
                    if isinstance(answer, Progress):
                        yield answers.progress_response(route, request, answer), False
                        continue
                    result, how = answer
                    outcome = "success"
                    if result.degraded:
                        self._telemetry.recent_requests.mark_degraded(request.id)
                    yield answers.generated_response(route, request, result, how), True
        except SordinoError:
            outcome = "failure"
            raise
        finally:
            ticket.release(outcome)

    # -- counting and answering ---------------------------------------------------------

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
        return Arrival(self._rejections, model, version, tenant)

    def refused_unread(
        self, model: str, version: str | None, tenant: str | None, reason: str, count: int = 1
    ) -> None:
        """Count ``count`` requests a transport refused unread for ``reason``.

        As :meth:`receiving` counts a request that ends while it is read.
        """
        self._rejections.count(model, version, tenant, reason, count)

    def triton_statistics(self, name: str | None = None, version: str | None = None) -> Any:
        """Return Triton's statistics-extension JSON for one model or all of them."""
        if name is None:
            return self._stats.triton_json([m.key for m in self._registry.models()])
        versions = [version] if version else self._registry.versions(name) or [""]
        return self._stats.triton_json([self._registry.get(name, v).key for v in versions])


def _hold_as_tensors(request: InferRequest) -> None:
    """Hold the request's inputs as the scheduler will (:class:`Tensors`), from here on:
    the bytes a row the ticket weighs are then kept with them (``Tensors.memo``) for the
    scheduler's overflow check and staging, instead of being worked out again."""
    inputs = request.inputs
    if not isinstance(inputs, Tensors):
        request.inputs = Tensors.of(inputs)
