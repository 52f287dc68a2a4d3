"""The per-model scheduler: the engine that owns requests from acceptance to their end.

It has the shape of vLLM's engine core. One task per model version loops over:

1. **schedule** — expire queued work past its deadline, then let the batcher decide:
   run a batch now (taking compatible work items from the priority queue) or wait;
2. **execute** — the batch runs on the executor (one async call), as a task of its
   own, so several batches run at once when the model has several instances;
3. **update from output** — each request gets its rows of the outputs; a request
   whose stream is not done is queued again for its next step, with the carried
   outputs as state (they stay in the arena); a finished one is counted and observed.

:class:`ModelScheduler` is the request side — accept (:meth:`~ModelScheduler.submit`),
read, cancel, close, retune, statistics — and composes the parts that do one job each:

- ``loop.py`` — the scheduling task, its wake-up event and timers, the batches running;
- ``shedding.py`` — the admission estimate: expected waits, sheds, hopeless work;
- ``overflow.py`` — what the arena lets a request and a batch hold;
- ``batches.py`` — one batch's executor call and its rows (a decoupled model's too);
- ``failures.py`` — a failed batch (a poisoned one run again request by request);
- ``steps.py`` — the step state machine (streams, iterative and decoupled models);
- ``parking.py`` — which queued tensors defragmentation may move;
- ``outcomes.py`` — each request's one outcome, the counts and the observers.

Requests are :class:`~sordino.scheduling.work.Request` objects the scheduler owns;
one-shot and streaming requests take the same path, so every request ends in exactly
one outcome and reaches the observers once.

Tensor ownership (see ``memory/refs.py``): a work item's inputs are released once its
step has run or it is dropped; the request's own inputs when it finishes; each step's
outputs are handed to the reader of the request's responses, who releases them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Mapping, Sequence

from sordino.clock import Clock
from sordino.errors import (
    Cancelled,
    Replaced,
    Shed,
    ShuttingDown,
    SordinoError,
)
from sordino.execution.executor import Executor
from sordino.inference import ModelKey, RequestFacts, StreamSpec, Tensor
from sordino.memory.refs import Tensors
from sordino.records import (
    QueueSettings,
    SchedulerObserver,
    SchedulerStatistics,
)
from sordino.scheduling.backlog import MeteredOutbox, StreamBudget
from sordino.scheduling.batches import BatchRunner
from sordino.scheduling.estimate import ARRIVAL_WINDOW_S, Arrivals, BatchCost
from sordino.scheduling.loop import SchedulingLoop
from sordino.scheduling.modes import ModeController
from sordino.scheduling.outcomes import Outcomes, discard_outputs
from sordino.scheduling.overflow import Overflow
from sordino.scheduling.parking import park_first_step, release_unrun
from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.shedding import ADMIT_SHARE, Shedder
from sordino.scheduling.steps import Steps
from sordino.scheduling.work import Request, StepOutput, Stepper

__all__ = ["ADMIT_SHARE", "ARRIVAL_WINDOW_S", "ModelScheduler"]


class ModelScheduler:
    """Queues, batches and runs the requests of one model version, step by step."""

    def __init__(
        self,
        model: ModelKey,
        *,
        batched: bool,
        executor: Executor,
        controller: ModeController,
        settings: QueueSettings,
        clock: Clock,
        observers: Sequence[SchedulerObserver] = (),
        stream_budget: StreamBudget | None = None,
    ) -> None:
        """``stream_budget``: bounds the responses a decoupled model's requests hold
        while their clients do not read them (None: unbounded)."""
        self.model = model
        self.stream_budget = stream_budget
        self.batched = batched
        self.settings = settings
        self._executor = executor
        self._controller = controller
        self._clock = clock
        self._queue = RequestQueue(
            priority_levels=settings.priority_levels,
            max_size=settings.max_queue_size,
            delay_expired=settings.timeout_action == "DELAY",
        )
        self._queue.set_levels(settings.levels)
        self._outcomes = Outcomes(model, clock=clock, queue=self._queue, observers=observers)
        self._overflow = Overflow(model, executor=executor, queue=self._queue)
        self._wake = asyncio.Event()
        self._steps = Steps(
            model,
            batched=batched,
            queue=self._queue,
            clock=clock,
            controller=controller,
            outcomes=self._outcomes,
            wake=self._wake.set,
        )
        cost = BatchCost()  # what batches took: the runner learns it, the estimates read it
        self._runner = BatchRunner(
            model,
            executor=executor,
            clock=clock,
            cost=cost,
            outcomes=self._outcomes,
            steps=self._steps,
            ordered=settings.preserve_ordering,
        )
        self._shedder = Shedder(
            model,
            executor=executor,
            queue=self._queue,
            clock=clock,
            controller=controller,
            settings=settings,
            outcomes=self._outcomes,
            arrivals=Arrivals(settings.priority_levels, clock.now()),
            cost=cost,
        )
        self._replaced = False
        self._loop = SchedulingLoop(
            model,
            executor=executor,
            queue=self._queue,
            clock=clock,
            controller=controller,
            wake=self._wake,
            outcomes=self._outcomes,
            shedder=self._shedder,
            overflow=self._overflow,
            cost=cost,
            runner=self._runner,
        )

    @property
    def clock(self) -> Clock:
        return self._clock

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduling task in the running event loop."""
        self._loop.start()

    async def close(self, *, drain: bool = True, replaced: bool = False) -> None:
        """Stop taking requests; finish the accepted ones (``drain``) or fail them, then stop.

        ``replaced``: another load of the model serves in its place (a reload), which
        a request refused from now on is told to retry on.

        With ``drain``, queued requests run, and streams keep stepping to their end.
        Without, queued work and the next steps of running streams end with an explicit
        :class:`ShuttingDown`, and running batches are cancelled (their requests get
        :class:`ShuttingDown` too), so a close without drain never waits on a batch,
        whatever it waits for. Every accepted request ends with an outcome.
        """
        self._loop.closing = True
        self._replaced = replaced
        if not drain:
            self._steps.aborting = True
            drained = self._queue.drain()
            for item in drained:
                self._outcomes.drop(item, ShuttingDown("the model is being unloaded"))
            if drained:
                self._outcomes.queue_changed()
            self._loop.cancel_running()
            for request in self._outcomes.still_answering():
                self._outcomes.fail(request, ShuttingDown("the model is being unloaded"))
        self._wake.set()
        await self._loop.join()
        # A decoupled model's requests still being answered (bounded by the timeout).
        await self._outcomes.answered.wait()
        self._loop.cancel_timer()
        self._outcomes.flush()  # the last requests' telemetry, before the model goes

    def retune(self, controller: ModeController, settings: QueueSettings) -> None:
        """Use ``controller`` and ``settings`` from the next decision on (hot reconfiguration).

        Queued and running work stays as it is: nothing is dropped or re-queued. The
        number of priority levels is the queue's shape and cannot change here.
        """
        if settings.priority_levels != self.settings.priority_levels:
            raise ValueError(
                f"model {self.model}: priority_levels cannot change while it is served "
                f"({self.settings.priority_levels} -> {settings.priority_levels}); reload it"
            )
        self._controller = controller
        self.settings = settings
        self._shedder.controller = controller
        self._steps.controller = controller
        self._loop.controller = controller
        self._shedder.settings = settings
        self._runner.ordered = settings.preserve_ordering
        self._queue.max_size = settings.max_queue_size
        self._queue.delay_expired = settings.timeout_action == "DELAY"
        self._queue.set_levels(settings.levels)
        self._wake.set()

    def running_for(self) -> float:
        """Seconds the longest-running batch has been running (0 with none running).

        Readiness reads it: a batch running far longer than any may (the execution
        timeout, a restart, the wait for arena space) means the model is wedged.
        """
        return self._loop.running_for()

    @property
    def executor(self) -> Executor:
        """What runs this scheduler's batches."""
        return self._executor

    # -- the request side ------------------------------------------------------------

    def submit(
        self,
        inputs: Mapping[str, Tensor],
        *,
        priority: int,
        timeout_s: float | None = None,
        request_id: str | None = None,
        stream: StreamSpec | None = None,
        stepper: Stepper | None = None,
        tenant: str = "",
        weight: int = 1,
        owner: str = "",
        decoupled: bool = False,
        facts: RequestFacts | None = None,
        again: Mapping[str, Tensor] | None = None,
    ) -> Request:
        """Accept one request and queue its first step; return the request.

        ``tenant`` and ``weight`` share a priority level among tenants (see the queue);
        ``owner`` is whom the request's memory is charged to in a Ray node's pool.
        ``facts`` are what a backend may know of the request (its batches' contexts
        carry them); None when the caller built none (its backend reads none).

        The scheduler takes ownership of ``inputs`` (a :class:`Tensors` is released when
        the request finishes). Raises at once, without accepting, when the queue is
        full or the scheduler is closing; ``inputs`` then stay the caller's.

        With a ``stepper`` (an iterative model) ``inputs`` are the first step's; after
        each step the stepper computes the next step's inputs (see :class:`Stepper`).
        ``decoupled``: the model sends its own responses (read them with :meth:`responses`).
        ``again``: the model may run the request again in a later batch (Triton's
        request rescheduling), with these inputs in place of its own (None: it may not).
        """
        if self._loop.closing:
            if self._replaced:
                raise Replaced(
                    f"model {self.model} was reloaded while this request waited; retry it "
                    "(the new load serves)"
                )
            raise ShuttingDown(f"model {self.model} is shutting down; retry on another replica")
        now = self._clock.now()
        tensors = Tensors.of(inputs)
        request = Request(
            inputs=tensors,
            priority=priority,
            arrival=now,
            timeout_s=timeout_s,
            id=request_id,
            stream=stream,
            stepper=stepper,
            tenant=tenant,
            weight=weight,
            owner=owner,
            decoupled=decoupled,
            facts=facts,
            again=again,
        )
        if decoupled and self.stream_budget is not None:
            request.outputs = MeteredOutbox(self.stream_budget)
        item = self._steps.work_item(request, tensors, now)
        try:
            self._overflow.refuse_oversized(item)
            self._shedder.shed_if_late(item, timeout_s)
            self._queue.put_nowait(item)
        except SordinoError:
            self._outcomes.rejected += 1
            raise
        park_first_step(item, tensors)
        self._outcomes.accepted += 1
        self._shedder.note_arrival(now, item.rows, item.priority)
        self._outcomes.queue_changed()
        self._loop.arrived()
        return request

    async def infer(
        self,
        inputs: Mapping[str, Tensor],
        *,
        priority: int,
        timeout_s: float | None = None,
        request_id: str | None = None,
    ) -> Tensors:
        """Run a one-shot request and return its outputs (the caller releases them).

        If the awaiting task is cancelled (the client went away), the request is
        removed from the queue if it has not started, and counted as cancelled.
        """
        request = self.submit(inputs, priority=priority, timeout_s=timeout_s, request_id=request_id)
        return await self.result(request)

    async def result(self, request: Request) -> Tensors:
        """Wait for the one response of a one-shot ``request``; the caller releases it.

        If the waiting task is cancelled, the request is cancelled (dropped from the
        queue if it has not started) and any output it got meanwhile is released.
        """
        try:
            result = await request.outputs.get()
        except BaseException:
            self.cancel(request)
            discard_outputs(request)
            raise
        if isinstance(result, SordinoError):
            raise result
        return result.outputs

    async def responses(self, request: Request) -> AsyncGenerator[StepOutput, None]:
        """Yield each step's outputs of ``request`` until its final one; raise its error.

        A decoupled model's error response that is not its last is yielded as a step
        with ``error`` set (and no outputs); the request goes on.

        The reader owns each yielded ``outputs`` and releases it. If the reader stops
        early (its task is cancelled, or it leaves the loop), the request is cancelled.
        """
        try:
            while True:
                result = await request.outputs.get()
                if isinstance(result, SordinoError):
                    raise result
                yield result
                if result.final:
                    return
        finally:
            if not request.finished:
                self.cancel(request)
            discard_outputs(request)

    def answered_from_cache(
        self, priority: int, total_s: float, request_id: str | None = None
    ) -> None:
        """Count a request the server answered from its response cache (never queued):
        a success of this model, as Triton counts one."""
        self._outcomes.answered_elsewhere(priority, total_s, request_id)

    def cancel(self, request: Request) -> None:
        """Cancel ``request``: drop its queued step; a running step finishes unseen."""
        if request.finished:
            return
        item = request.item
        if item is not None and self._queue.remove(item):
            self._outcomes.queue_changed()
            release_unrun(item.inputs)
            request.item = None
        self._outcomes.finish(request, "cancelled", Cancelled.reason)

    # -- overload and figures --------------------------------------------------------

    def shed_unread(self, priority: int, timeout_s: float | None) -> Shed | None:
        """The refusal of a request not yet decoded, by the rule applied at arrival.

        A transport that knows a request's priority and deadline before reading its
        body (``server/early_shed.py``) asks here: the answer is the :class:`Shed`
        :meth:`submit` would raise for it now, or None. Each request refused on such an
        answer (it may serve for several alike) is counted by
        :meth:`note_unread_refusal`.
        """
        return self._shedder.late(priority, timeout_s)

    def note_unread_refusal(self) -> None:
        """Count a request refused unread on a :meth:`shed_unread` answer (rejected)."""
        self._outcomes.rejected += 1

    @property
    def queued(self) -> int:
        """Work items waiting now (each request has at most one)."""
        return len(self._queue)

    def expected_wait(self, priority: int) -> float | None:
        """About how long a step queued now at ``priority`` takes to run (None: unknown).

        See :meth:`Shedder.expected_wait <sordino.scheduling.shedding.Shedder.expected_wait>`.
        """
        return self._shedder.expected_wait(priority)

    def admission_wait(self, priority: int) -> float | None:
        """:meth:`expected_wait` as the arrival rule reads it (None while the model is
        idle and its batch time stale: see :meth:`Shedder.admission_wait
        <sordino.scheduling.shedding.Shedder.admission_wait>`); what front ends refuse on."""
        return self._shedder.admission_wait(priority)

    def rows_ahead(self, priority: int) -> int:
        """Rows queued now at ``priority`` and higher (what a :class:`Shed` names)."""
        return self._shedder.rows_ahead(priority)

    def _arrival_rate(self) -> float:
        """Rows a second arriving now: what the batcher waits for."""
        return self._shedder.arrival_rate()

    def statistics(self) -> SchedulerStatistics:
        """Return a snapshot of this scheduler."""
        outcomes = self._outcomes
        return SchedulerStatistics(
            model=self.model.name,
            version=self.model.version,
            accepted=outcomes.accepted,
            succeeded=outcomes.succeeded,
            failed=outcomes.failed,
            cancelled=outcomes.cancelled,
            in_flight=outcomes.in_flight(),
            rejected=outcomes.rejected,
            timed_out=outcomes.timed_out,
            batches=outcomes.batches,
            batched_rows=outcomes.batched_rows,
            isolated_batches=outcomes.isolated,
            running_batches=self._loop.running_batches,
            queue=self._queue.statistics(),
            controller=self._controller.statistics(),
        )
