"""The per-model scheduler: the engine that owns requests from acceptance to their end.

It has the shape of vLLM's engine core. One task per model version loops over:

1. **schedule** — expire queued work past its deadline, then let the batcher decide:
   run a batch now (taking compatible work items from the priority queue) or wait;
2. **execute** — the batch runs on the executor (one async call), as a task of its
   own, so several batches run at once when the model has several instances;
3. **update from output** — each request gets its rows of the outputs; a request
   whose stream is not done is queued again for its next step, with the carried
   outputs as state (they stay in the arena); a finished one is counted and observed.

A decoupled model's batch (``submit(..., decoupled=True)``) runs through the executor's
``run_decoupled`` with a :class:`~sordino.execution.decoupled.ResponseChannel`: the batch
ends when ``execute`` returned, and each request stays running, getting a
:class:`StepOutput` per response the model sends, until its final one, an error, the
execution timeout or a cancellation (which the channel passes on to the model).

The loop waits on a single wake-up event, set when work arrives, when a batch ends,
when a timer for the batch delay or the next deadline fires, or on close. It never
polls. Requests are :class:`~sordino.scheduling.work.Request` objects the scheduler
owns; one-shot and streaming requests take the same path, so every request ends in
exactly one outcome and reaches the observers once.

Tensor ownership (see ``memory/refs.py``): a work item's inputs are released once its
step has run or it is dropped; the request's own inputs when it finishes; each step's
outputs are handed to the reader of the request's responses, who releases them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Mapping, Sequence

import numpy as np

from sordino.clock import Clock, TimerHandle
from sordino.errors import (
    Cancelled,
    InferenceFailed,
    InvalidRequest,
    ModelError,
    QueueTimeout,
    RateLimited,
    Shed,
    ShuttingDown,
    SordinoError,
    Unsupported,
)
from sordino.execution.batch import BatchContext, Cancels
from sordino.execution.decoupled import ResponseChannel
from sordino.execution.executor import Executor, MemoryFit
from sordino.inference import ModelKey, RequestFacts, StreamSpec, Tensor, release_owned
from sordino.memory.refs import Tensors
from sordino.memory.region import StepRegion
from sordino.records import (
    BatchDone,
    Outcome,
    QueueSettings,
    RequestDone,
    SchedulerObserver,
    SchedulerStatistics,
)
from sordino.scheduling.batcher import Dispatch, decide
from sordino.scheduling.estimate import ARRIVAL_WINDOW_S, Arrivals, BatchCost
from sordino.scheduling.modes import ModeController
from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.work import Request, StepOutput, Stepper, WorkItem, signature_of

__all__ = ["ADMIT_SHARE", "ARRIVAL_WINDOW_S", "ModelScheduler"]

ADMIT_SHARE = 0.8
"""A request is admitted while the wait expected for it is at most this share of its
deadline: the rest is the margin for the estimate's error (a queue's wait varies), so
a request admitted is one that finishes in time, and one refused is refused at once,
not after waiting out its deadline."""


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
    ) -> None:
        self.model = model
        self.batched = batched
        self.settings = settings
        self._executor = executor
        self._controller = controller
        self._clock = clock
        self._observers = tuple(observers)
        self._queue = RequestQueue(
            priority_levels=settings.priority_levels,
            max_size=settings.max_queue_size,
            delay_expired=settings.timeout_action == "DELAY",
        )
        self._wake = asyncio.Event()
        self._timer: TimerHandle | None = None
        self._timer_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        self._started: dict[asyncio.Task[None], float] = {}
        self._closing = False
        self._aborting = False
        self._arrivals = Arrivals(settings.priority_levels, clock.now())
        self._accepted = self._succeeded = self._failed = self._cancelled = 0
        self._rejected = self._timed_out = self._batches = self._batched_rows = 0
        self._isolated = 0
        self._cost = BatchCost()
        self._answering: set[Request] = set()  # decoupled requests whose batch has run
        self._answered = asyncio.Event()
        self._answered.set()

    @property
    def clock(self) -> Clock:
        return self._clock

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduling task in the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"sordino-scheduler-{self.model}"
            )

    async def close(self, *, drain: bool = True) -> None:
        """Stop taking requests; finish the accepted ones (``drain``) or fail them, then stop.

        With ``drain``, queued requests run, and streams keep stepping to their end.
        Without, queued work and the next steps of running streams end with an explicit
        :class:`ShuttingDown`, and running batches are cancelled (their requests get
        :class:`ShuttingDown` too), so a close without drain never waits on a batch,
        whatever it waits for. Every accepted request ends with an outcome.
        """
        self._closing = True
        if not drain:
            self._aborting = True
            for item in self._queue.drain():
                self._drop(item, ShuttingDown("the model is being unloaded"))
            for task in self._running:
                task.cancel()
            for request in list(self._answering):
                self._fail(request, ShuttingDown("the model is being unloaded"))
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        # A decoupled model's requests still being answered (bounded by the timeout).
        await self._answered.wait()
        if self._timer is not None:
            self._timer.cancel()

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
        self._queue.max_size = settings.max_queue_size
        self._queue.delay_expired = settings.timeout_action == "DELAY"
        self._wake.set()

    def running_for(self) -> float:
        """Seconds the longest-running batch has been running (0 with none running).

        Readiness reads it: a batch running far longer than any may (the execution
        timeout, a restart, the wait for arena space) means the model is wedged.
        """
        if not self._started:
            return 0.0
        return max(0.0, self._clock.now() - min(self._started.values()))

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
        """
        if self._closing:
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
        )
        item = self._work_item(request, tensors, now)
        try:
            self._refuse_oversized(item)
            self._shed_if_late(item, timeout_s)
            self._queue.put_nowait(item)
        except SordinoError:
            self._rejected += 1
            raise
        # The step's own hold (the request keeps its own); heap tensors need none.
        item.inputs = tensors.share() if tensors.leases else tensors
        # Queued work and the request's own inputs are read only when the step runs:
        # until then defragmentation may move their arena blocks.
        _park(item.inputs)
        tensors.park()
        self._accepted += 1
        self._arrivals.note(now, item.rows, item.priority, self._in_flight())
        self._queue_changed()
        self._wake.set()
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
            _discard_outputs(request)
            raise
        if isinstance(result, SordinoError):
            raise result
        return result.outputs

    async def responses(self, request: Request) -> AsyncGenerator[StepOutput, None]:
        """Yield each step's outputs of ``request`` until its final one; raise its error.

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
            _discard_outputs(request)

    def cancel(self, request: Request) -> None:
        """Cancel ``request``: drop its queued step; a running step finishes unseen."""
        if request.finished:
            return
        item = request.item
        if item is not None and self._queue.remove(item):
            self._queue_changed()
            _unpark(item.inputs)
            release_owned(item.inputs)
            request.item = None
        self._finish(request, "cancelled", Cancelled.reason)

    # -- the scheduling loop ---------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            now = self._clock.now()
            batch = self._schedule(now)
            if batch is None:
                if self._closing and len(self._queue) == 0 and not self._running:
                    return
                await self._wake.wait()
                continue
            self._queue_changed()
            for item in batch:
                _unpark(item.inputs)  # about to be read: pinned where it lies
                item.dispatched_at = now
                if item.request is not None:
                    item.request.state = "running"
                    item.request.queue_s += now - item.arrival
            task = asyncio.get_running_loop().create_task(self._execute(batch))
            self._running.add(task)
            self._started[task] = now
            task.add_done_callback(self._batch_finished)

    def _schedule(self, now: float) -> list[WorkItem] | None:
        """Return the work items to run as one batch now, or None (a timer is set)."""
        for item in self._queue.expire(now):
            self._timed_out += 1
            waited_ms = (now - item.arrival) * 1000
            self._drop(
                item,
                QueueTimeout(
                    f"request timed out in the queue of model {self.model} after "
                    f"{waited_ms:.0f} ms without running; raise its timeout or reduce load"
                ),
            )
        if len(self._queue) == 0:
            self._set_timer(None)
            return None
        instances = max(1, self._executor.instances(self.model))
        if len(self._running) >= instances:
            self._set_timer(self._queue.next_deadline())
            return None
        # With another instance idle besides the one this batch takes, waiting to fill
        # it would leave that capacity unused: run now (no arrivals expected).
        rate = self._arrival_rate() if len(self._running) + 1 >= instances else 0.0
        decision = decide(self._queue, self._controller.policy(), now, rate)
        if isinstance(decision, Dispatch):
            rows = self._rows_that_fit(decision)
            batch = self._drop_hopeless(
                self._queue.take(decision.signature, rows, self._cost.ride_along), now
            )
            if not batch:
                self._wake.set()  # every item was hopeless: look at the queue again at once
                return None
            return batch
        assert decision is not None
        wake_at = decision.until
        deadline = self._queue.next_deadline()
        if deadline is not None:
            wake_at = min(wake_at, deadline)
        self._set_timer(wake_at)
        return None

    def _memory_fit(self, inputs: Mapping[str, Tensor]) -> MemoryFit | None:
        # Executors written before overflow protection have no memory_fit: no protection.
        memory_fit = getattr(self._executor, "memory_fit", None)
        return memory_fit(self.model, inputs) if memory_fit is not None else None

    def _rows_that_fit(self, decision: Dispatch) -> int:
        """Overflow protection: shrink the batch to the rows the arena can hold now.

        The head item always runs (if even it does not fit now, staging waits a
        bounded time for space, then answers 503).
        """
        head = self._queue.head()
        if head is None or head.signature != decision.signature:
            return decision.rows
        fit = self._memory_fit(head.inputs)
        if fit is None or fit.row_bytes <= 0:
            return decision.rows
        rows = max(head.rows, fit.free // fit.row_bytes)
        if rows < decision.rows:
            fit.counters.shrinks += 1
            return rows
        return decision.rows

    def _refuse_oversized(self, item: WorkItem) -> None:
        """A request that alone is larger than the arena can never run: 400 at once."""
        fit = self._memory_fit(item.inputs)
        if fit is None:
            return
        needed = fit.row_bytes * item.rows
        if needed > fit.capacity:
            fit.counters.oversized += 1
            raise InvalidRequest(
                f"the request needs {needed} bytes of shared memory for its inputs and "
                f"outputs, more than the whole arena holds ({fit.capacity} bytes, "
                "memory.pool_size); send fewer rows per request or raise memory.pool_size"
            )

    def _drop_hopeless(self, batch: list[WorkItem], now: float) -> list[WorkItem]:
        """Never start work that cannot finish before its deadline (REJECT action only).

        A batch takes about the recent batches' run time; an item whose deadline is
        nearer than that is answered now (503) instead of computed for a client that
        will have given up.
        """
        batch_s = self._cost.mean_s
        if batch_s is None or self.settings.timeout_action != "REJECT":
            return batch
        finish = now + batch_s
        kept = []
        for item in batch:
            if item.deadline is not None and item.deadline < finish:
                self._timed_out += 1
                self._drop(
                    item,
                    QueueTimeout(
                        f"request to model {self.model} cannot finish before its deadline "
                        f"({(item.deadline - now) * 1000:.0f} ms left, a batch takes about "
                        f"{batch_s * 1000:.0f} ms); it was not run. Raise its timeout "
                        "or reduce load"
                    ),
                )
            else:
                kept.append(item)
        return kept

    def _set_timer(self, when: float | None) -> None:
        """Wake the loop at ``when`` (None: no timer), keeping a pending timer for that time."""
        if when == self._timer_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = when
        if when is not None:
            self._timer = self._clock.call_at(when, self._timer_fired)

    def _timer_fired(self) -> None:
        # Forget the timer: event-loop timers may fire a little before ``when`` (uvloop
        # rounds to milliseconds), and the loop must then be able to set it again.
        self._timer = None
        self._timer_at = None
        self._wake.set()

    def _batch_finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._started.pop(task, None)
        self._wake.set()

    async def _execute(self, items: list[WorkItem]) -> None:
        """Run one batch and hand each request its rows; release the steps' inputs."""
        live: list[WorkItem] = []
        for item in items:
            if item.request is not None and item.request.finished:
                release_owned(item.inputs)  # cancelled between the queue and here
            else:
                live.append(item)
        if not live:
            return
        # Staging (the inputs into the arena) happens inside the executor's one call,
        # so its time counts as compute, and the Triton "compute_input" phase is 0.
        try:
            await self._run_batch(live)
        finally:
            for item in live:
                release_owned(item.inputs)

    async def _run_batch(self, live: list[WorkItem]) -> None:
        first_request = live[0].request
        if first_request is not None and first_request.decoupled:
            await self._run_decoupled(live)
            return
        t0 = t1 = self._clock.now()
        rows = sum(item.rows for item in live)
        context = _context(live)
        cancels = context.cancels
        if cancels is not None:
            # A request cancelled while its batch runs: the model is told (is_cancelled()).
            for index, item in enumerate(live):
                if item.request is not None:
                    item.request.stop = functools.partial(cancels.cancel, index)
        try:
            outputs = await self._executor.run(self.model, [item.inputs for item in live], context)
        except asyncio.CancelledError:
            self._batch_cancelled(live, t0)
            raise
        except Exception as exc:  # the backend's failure is the requests' failure
            _unstop(live, cancels)
            t2 = self._clock.now()
            self._batches += 1
            message = str(exc) if isinstance(exc, SordinoError) else f"{type(exc).__name__}: {exc}"
            error: SordinoError = (
                exc
                if isinstance(exc, SordinoError)
                else InferenceFailed(f"model {self.model} failed on a batch of {rows}: {message}")
            )
            self._batch_observed(rows, len(live), t1 - t0, t2 - t1, 0.0, ok=False)
            if isinstance(error, ModelError | RateLimited) and len(live) > 1:
                # One request the model cannot take must not fail the others: run each
                # alone, so only the offender fails (a poisoned batch costs its size).
                # So too a tenant over its quota in a Ray node's pool (RateLimited).
                self._isolated += 1
                try:
                    for item in live:
                        if item.request is None or not item.request.finished:
                            await self._run_batch([item])
                except asyncio.CancelledError:
                    self._batch_cancelled(live, t0)  # those not run alone yet
                    raise
                return
            for item in live:
                self._step_failed(item, error, t2 - t0)
            return
        _unstop(live, cancels)
        t2 = self._clock.now()
        self._cost.note(rows, t2 - t0)
        with outputs:
            offset = 0
            for item in live:
                if len(live) == 1:
                    result = outputs.share()
                else:
                    result = outputs.rows(offset, offset + item.rows)
                offset += item.rows
                self._update_from_output(item, result, t2 - t0)
        t3 = self._clock.now()
        self._batches += 1
        self._batched_rows += rows
        self._batch_observed(rows, len(live), t1 - t0, t2 - t1, t3 - t2, ok=True)

    async def _run_decoupled(self, live: list[WorkItem]) -> None:
        """Run a decoupled model's batch; its requests are answered as the model sends."""
        t0 = self._clock.now()
        rows = sum(item.rows for item in live)
        requests = [item.request for item in live]

        def respond(index: int, outputs: dict[str, np.ndarray], final: bool) -> None:
            request = requests[index]
            if request is not None and not request.finished:
                self._decoupled_response(request, outputs, final)

        def fail(index: int, message: str) -> None:
            request = requests[index]
            if request is not None:
                self._fail(request, InferenceFailed(message))

        channel = ResponseChannel(str(self.model), len(live), respond, fail)
        for index, request in enumerate(requests):
            if request is not None:
                request.stop = functools.partial(channel.cancel, index)
                self._answering.add(request)
                self._answered.clear()
        run = getattr(self._executor, "run_decoupled", None)
        try:
            if run is None:
                raise Unsupported(
                    f"model {self.model} is decoupled (it sends its own responses); this "
                    "executor cannot run such a model: serve it with isolation process or thread"
                )
            await run(self.model, [item.inputs for item in live], channel, _context(live))
        except asyncio.CancelledError:
            channel.fail(
                f"model {self.model} is being unloaded or the server is stopping; its batch "
                "was cancelled before it finished: retry on another replica"
            )
            raise
        except Exception as exc:
            # The batch's own error (its class says how to answer: 500, 503, ...) for every
            # request still open; nothing more is delivered for it.
            error = (
                exc
                if isinstance(exc, SordinoError)
                else InferenceFailed(f"model {self.model} failed on a batch: {exc!r}")
            )
            for index in channel.close():
                request = requests[index]
                if request is not None:
                    self._fail(request, error)
            self._batches += 1
            self._batch_observed(rows, len(live), 0.0, self._clock.now() - t0, 0.0, ok=False)
            return
        finally:
            for request in requests:
                if request is not None:
                    request.item = None
        t2 = self._clock.now()
        self._cost.note(rows, t2 - t0)
        self._batches += 1
        self._batched_rows += rows
        for request in requests:
            if request is not None:
                request.compute_s += t2 - t0
        self._batch_observed(rows, len(live), 0.0, t2 - t0, 0.0, ok=True)

    def _decoupled_response(
        self, request: Request, outputs: dict[str, np.ndarray], final: bool
    ) -> None:
        """One response a decoupled model sent ``request``; a bare final flag ends it."""
        request.steps += 1
        if outputs:
            request.outputs.put_nowait(StepOutput(Tensors.of(outputs), final, request.steps))
        elif final:
            request.outputs.put_nowait(StepOutput(Tensors.of({}), True, request.steps, empty=True))
        if final:
            self._finish(request, "success", "ok")

    def _batch_cancelled(self, live: list[WorkItem], t0: float) -> None:
        """The batch's task was cancelled (a close without drain): answer its requests
        ShuttingDown, so none is left without an outcome."""
        stopped = ShuttingDown(
            f"model {self.model} is being unloaded or the server is stopping; its batch "
            "was cancelled before it finished: retry on another replica"
        )
        for item in live:
            self._step_failed(item, stopped, self._clock.now() - t0)

    def _update_from_output(self, item: WorkItem, result: Tensors, compute_s: float) -> None:
        """Deliver one step's ``result`` to its request; queue the next step or finish."""
        request = item.request
        if request is None or request.finished:
            result.release()  # cancelled while it ran: nobody reads this any more
            return
        request.item = None
        request.steps += 1
        request.compute_s += compute_s
        if request.stream is not None or request.stepper is not None:
            if request.step_bytes is None:
                request.step_bytes = []
            request.step_bytes.append((_nbytes(item.inputs), _nbytes(result)))
        now = self._clock.now()
        self._controller.observe(now, now - item.arrival, backlog_rows=self._queue.rows)
        if request.stepper is not None:
            self._advance(request, result, now)
            return
        spec = request.stream
        final = spec is None or _stream_done(result, spec)
        if not final and request.steps >= request.max_steps:
            assert spec is not None
            result.release()
            self._fail(
                request,
                InferenceFailed(
                    f"model {self.model} streamed {request.steps} responses without setting "
                    f"{spec.done!r}; raise streaming.max_steps or fix the model"
                ),
            )
            return
        if not final:
            assert spec is not None
            if self._aborting:
                result.release()
                self._fail(request, ShuttingDown("the model is being unloaded"))
                return
            # ``carry`` maps an output to the input it feeds on the next step.
            by_input = {target: source for source, target in spec.carry}
            parts = {
                name: (result, by_input[name]) if name in by_input else (request.inputs, name)
                for name in request.inputs
            }
            state = Tensors.compose(parts)
            next_item = self._work_item(request, state, now)
            self._queue.put_nowait(next_item, force=True)
            state.park()  # carried state waits in the queue: defragmentation may move it
            request.state = "queued"
            self._queue_changed()
            self._wake.set()
        if spec is not None and spec.emit is not None and not np.any(result[spec.emit]):
            # A decoupled model's step that sends nothing; the end still tells the reader.
            result.release()
            if final:
                request.outputs.put_nowait(
                    StepOutput(Tensors.of({}), final, request.steps, empty=True)
                )
        else:
            request.outputs.put_nowait(StepOutput(result, final, request.steps))
        if final:
            self._finish(request, "success", "ok")

    def _advance(self, request: Request, result: Tensors, now: float) -> None:
        """An iterative request's step ran: let its stepper compute the next one."""
        assert request.stepper is not None
        try:
            with result:
                following, delivered = request.stepper.advance(result, now)
        except SordinoError as exc:
            self._fail(request, exc)
            return
        except Exception as exc:  # a bug in the sampler is this request's failure
            self._fail(request, InferenceFailed(f"the sampler of {self.model} failed: {exc}"))
            return
        final = following is None
        if following is not None:
            if self._aborting:
                following.release()
                if delivered is not None:
                    delivered.release()
                self._fail(request, ShuttingDown("the model is being unloaded"))
                return
            # The request's next step: queued by its priority, so a higher-priority
            # request's steps go first and this one resumes from its state (kept in
            # ``following``, in the arena) when its turn comes.
            request.inputs.release()
            request.inputs = following.share() if following.leases else following
            self._queue.put_nowait(self._work_item(request, following, now), force=True)
            # The state waits in the queue: defragmentation may move it (the stepper
            # keeps its own copy of the sample, never an array taken from ``following``).
            following.park()
            request.inputs.park()
            request.state = "queued"
            self._queue_changed()
            self._wake.set()
        if delivered is not None:
            request.outputs.put_nowait(StepOutput(delivered, final, request.steps))
        if final:
            self._finish(request, "success", "ok")

    # -- bookkeeping -----------------------------------------------------------------

    def _work_item(self, request: Request, inputs: Tensors, now: float) -> WorkItem:
        rows = int(next(iter(inputs.values())).shape[0]) if self.batched else 1
        timeout_s = request.timeout_s
        item = WorkItem(
            inputs=inputs,
            rows=rows,
            signature=signature_of(inputs, self.batched),
            priority=request.priority,
            arrival=now,
            deadline=now + timeout_s if timeout_s else None,
            request=request,
        )
        request.item = item
        return item

    def _drop(self, item: WorkItem, error: SordinoError) -> None:
        """A queued item will never run: release its inputs and fail its request."""
        _unpark(item.inputs)
        release_owned(item.inputs)
        if item.request is not None:
            item.request.item = None
            self._fail(item.request, error)

    def _step_failed(self, item: WorkItem, error: SordinoError, compute_s: float) -> None:
        request = item.request
        if request is None or request.finished:
            return
        request.item = None
        request.compute_s += compute_s
        self._fail(request, error)

    def _fail(self, request: Request, error: SordinoError) -> None:
        if request.finished:
            return
        request.outputs.put_nowait(error)
        self._finish(request, "failure", error.reason)

    def _finish(self, request: Request, outcome: Outcome, reason: str) -> None:
        request.state = "finished"
        request.outcome = outcome
        request.inputs.release()
        stop, request.stop = request.stop, None
        if stop is not None:
            stop()  # a request that ended before the model did: the model is told
            self._answering.discard(request)
            if not self._answering:
                self._answered.set()
        region = request.region
        if region is not None:
            region.close()  # back to the arena once its last outputs are released
        if request.stepper is not None:
            request.stepper.close()
        if outcome == "success":
            self._succeeded += 1
        elif outcome == "cancelled":
            self._cancelled += 1
            _discard_outputs(request)
        else:
            self._failed += 1
        now = self._clock.now()
        late = None
        if request.timeout_s:
            late = max(0.0, now - request.arrival - request.timeout_s)
        done = RequestDone(
            self.model,
            outcome,
            reason,
            request.priority,
            request.queue_s,
            request.compute_s,
            now - request.arrival,
            late,
            tuple(request.step_bytes) if request.step_bytes else (),
            (region.planned_bytes, region.peak_bytes, region.fallbacks)
            if region is not None and region.planned_bytes
            else (),
            request.id,
        )
        for observer in self._observers:
            observer.request_done(done)

    def _batch_observed(
        self, rows: int, requests: int, input_s: float, infer_s: float, output_s: float, *, ok: bool
    ) -> None:
        done = BatchDone(self.model, rows, requests, input_s, infer_s, output_s, ok)
        for observer in self._observers:
            observer.batch_done(done)

    def _queue_changed(self) -> None:
        for observer in self._observers:
            observer.queue_changed(self.model, len(self._queue))

    def _shed_if_late(self, item: WorkItem, timeout_s: float | None) -> None:
        """Refuse ``item`` now if the work ahead of it would make it miss its deadline."""
        error = self._late(item.priority, timeout_s)
        if error is not None:
            raise error

    def shed_unread(self, priority: int, timeout_s: float | None) -> Shed | None:
        """The refusal of a request not yet decoded, by the rule applied at arrival.

        A transport that knows a request's priority and deadline before reading its
        body (``server/early_shed.py``) asks here: the answer is the :class:`Shed`
        :meth:`submit` would raise for it now, or None. Each request refused on such an
        answer (it may serve for several alike) is counted by
        :meth:`note_unread_refusal`.
        """
        return self._late(priority, timeout_s)

    def note_unread_refusal(self) -> None:
        """Count a request refused unread on a :meth:`shed_unread` answer (rejected)."""
        self._rejected += 1

    def _late(self, priority: int, timeout_s: float | None) -> Shed | None:
        """Whether a request at ``priority`` queued now would miss its deadline.

        Ahead of it are the rows queued at its priority and higher, served at the rate
        the model's recent batches ran at (``instances`` batches at a time), plus one
        batch's time for its own. Lower priorities have more ahead, so they are shed
        first and fast, while higher ones are still accepted. Never under
        ``frame_sync`` (``settings.shed_late`` false): a late frame runs late.
        """
        if not timeout_s or not self.settings.shed_late:
            return None
        expected_s = self.expected_wait(priority)
        if expected_s is None or expected_s <= ADMIT_SHARE * timeout_s:
            return None
        return Shed(
            f"model {self.model} is overloaded: {self._queue.rows_ahead(priority)} rows at "
            f"priority {priority} or higher are ahead, about {expected_s * 1000:.0f} ms of "
            f"work, more than {ADMIT_SHARE:.0%} of the request's "
            f"{timeout_s * 1000:.0f} ms deadline; retry later, raise the deadline or the "
            "priority",
            retry_after_s=expected_s,
        )

    @property
    def queued(self) -> int:
        """Work items waiting now (each request has at most one)."""
        return len(self._queue)

    def expected_wait(self, priority: int) -> float | None:
        """About how long a step queued now at ``priority`` takes to run (None: unknown).

        The rows queued at its priority and higher, and the higher priorities that
        will arrive meanwhile, at what recent batches cost (:meth:`BatchCost.wait
        <sordino.scheduling.estimate.BatchCost.wait>`), plus one batch: what
        :meth:`_late` compares to a deadline. An iterative request's steps each take
        about this long.
        """
        instances = max(1, self._executor.instances(self.model))
        higher = self._arrivals.higher_rate(priority, self._clock.now()) if priority > 1 else 0.0
        return self._cost.wait(
            self._queue.rows_ahead(priority), instances, self._controller.policy().max_batch, higher
        )

    def _in_flight(self) -> int:
        return self._accepted - self._succeeded - self._failed - self._cancelled

    def _arrival_rate(self) -> float:
        """Rows a second arriving now (:meth:`Arrivals.rate
        <sordino.scheduling.estimate.Arrivals.rate>`): what the batcher waits for."""
        return self._arrivals.rate(self._clock.now(), self._in_flight())

    def statistics(self) -> SchedulerStatistics:
        """Return a snapshot of this scheduler."""
        in_flight = self._accepted - self._succeeded - self._failed - self._cancelled
        return SchedulerStatistics(
            model=self.model.name,
            version=self.model.version,
            accepted=self._accepted,
            succeeded=self._succeeded,
            failed=self._failed,
            cancelled=self._cancelled,
            in_flight=in_flight,
            rejected=self._rejected,
            timed_out=self._timed_out,
            batches=self._batches,
            batched_rows=self._batched_rows,
            isolated_batches=self._isolated,
            running_batches=len(self._running),
            queue=self._queue.statistics(),
            controller=self._controller.statistics(),
        )


def _unstop(live: Sequence[WorkItem], cancels: Cancels | None) -> None:
    """The batch ran: its requests' ends no longer concern the model."""
    if cancels is not None:
        for item in live:
            if item.request is not None:
                item.request.stop = None


def _context(live: Sequence[WorkItem]) -> BatchContext:
    """What the executor is told of a batch besides its tensors (one entry per item)."""
    requests = [item.request for item in live]
    first = requests[0]
    # Chaos faults scoped to a tenant hit only batches holding its requests. Work is
    # all tenanted (tenants configured) or none of it is: the first item says.
    tenants: frozenset[str] = frozenset()
    if first is not None and first.tenant:
        tenants = frozenset(r.tenant for r in requests if r is not None)
    # A step of one multi-step request: its outputs go to the request's region.
    region = None
    if len(live) == 1 and first is not None and (first.stream or first.stepper):
        if first.region is None:
            first.region = StepRegion(carried=first.stepper is None)
        region = first.region
    # Facts only where the caller built them (for a backend that reads them); a request
    # without (a pipeline's node request) then gets its priority alone.
    facts: tuple[RequestFacts, ...] = ()
    if any(r is not None and r.facts is not None for r in requests):
        facts = tuple(
            r.facts if r is not None and r.facts is not None else RequestFacts(priority=i.priority)
            for r, i in zip(requests, live, strict=True)
        )
    return BatchContext(
        owners=tuple(r.owner if r is not None else "" for r in requests),
        tenants=tenants,
        region=region,
        requests=facts,
        # A backend that reads the facts (Triton's Python) is also told of cancellations.
        cancels=Cancels() if facts and not (first is not None and first.decoupled) else None,
    )


def _nbytes(tensors: Mapping[str, Tensor]) -> int:
    return sum(int(array.nbytes) for array in tensors.values())


def _park(inputs: Mapping[str, Tensor]) -> None:
    if isinstance(inputs, Tensors):
        inputs.park()


def _unpark(inputs: Mapping[str, Tensor]) -> None:
    if isinstance(inputs, Tensors):
        inputs.unpark()


def _discard_outputs(request: Request) -> None:
    """Release step outputs nobody will read (the reader left or the request was cancelled)."""
    while not request.outputs.empty():
        result = request.outputs.get_nowait()
        if isinstance(result, StepOutput):
            result.outputs.release()


def _stream_done(outputs: Tensors, spec: StreamSpec) -> bool:
    return bool(np.all(outputs[spec.done]))
