"""The per-model scheduler: admits work items, forms batches, runs them, splits results.

One scheduler task per model version waits on a single wake-up event, set when work
arrives, when an instance frees up, when a timer for the batch delay or the next
deadline fires, or on close. It never polls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sordino.clock import Clock, TimerHandle
from sordino.errors import (
    Cancelled,
    InferenceFailed,
    QueueTimeout,
    ShuttingDown,
    SordinoError,
)
from sordino.execution.executor import Executor, assemble
from sordino.inference import ModelKey, Tensor
from sordino.records import Outcome, QueueSettings, SchedulerObserver, SchedulerStatistics
from sordino.scheduling.batcher import Dispatch, decide
from sordino.scheduling.modes import ModeController
from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.work import WorkItem, signature_of

__all__ = ["ModelScheduler"]


class ModelScheduler:
    """Queues, batches and runs the requests of one model version."""

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
        self._closing = False
        self._last_arrival: float | None = None
        self._gap_ewma: float | None = None
        self._accepted = self._succeeded = self._failed = self._cancelled = 0
        self._rejected = self._timed_out = self._batches = self._batched_rows = 0

    # -- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Start the scheduling task in the running event loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name=f"sordino-scheduler-{self.model}"
            )

    async def close(self, *, drain: bool = True) -> None:
        """Stop taking work; run what is queued (``drain``) or fail it, then stop.

        Every queued request ends with a result or an explicit :class:`ShuttingDown`.
        """
        self._closing = True
        if not drain:
            for item in self._queue.drain():
                self._finish_error(item, ShuttingDown("the model is being unloaded"))
        self._wake.set()
        if self._task is not None:
            await self._task
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        if self._timer is not None:
            self._timer.cancel()

    # -- the request side ------------------------------------------------------------

    def submit(
        self,
        inputs: dict[str, Tensor],
        *,
        priority: int,
        timeout_s: float | None = None,
        request_id: str | None = None,
    ) -> WorkItem:
        """Queue one request and return its work item, whose future carries the result.

        Raises at once, without queueing, when the queue is full or the scheduler is
        closing.
        """
        if self._closing:
            raise ShuttingDown(f"model {self.model} is shutting down; retry on another replica")
        now = self._clock.now()
        rows = int(next(iter(inputs.values())).shape[0]) if self.batched else 1
        future: asyncio.Future[dict[str, Tensor]] = asyncio.get_running_loop().create_future()
        item = WorkItem(
            inputs=inputs,
            rows=rows,
            signature=signature_of(inputs, self.batched),
            priority=priority,
            arrival=now,
            future=future,
            deadline=now + timeout_s if timeout_s else None,
            request_id=request_id,
        )
        try:
            self._queue.put_nowait(item)
        except SordinoError:
            self._rejected += 1
            raise
        self._accepted += 1
        self._note_arrival(now, rows)
        self._queue_changed()
        self._wake.set()
        return item

    async def infer(
        self,
        inputs: dict[str, Tensor],
        *,
        priority: int,
        timeout_s: float | None = None,
        request_id: str | None = None,
    ) -> dict[str, Tensor]:
        """Queue one request and wait for its outputs.

        If the awaiting task is cancelled (the client went away), the request is
        removed from the queue if it has not started, and counted as cancelled.
        """
        item = self.submit(inputs, priority=priority, timeout_s=timeout_s, request_id=request_id)
        return await self.result(item)

    async def result(self, item: WorkItem) -> dict[str, Tensor]:
        """Wait for the outputs of a submitted ``item``; cancel it if the waiter is cancelled."""
        try:
            return await asyncio.shield(item.future)
        except asyncio.CancelledError:
            self.cancel(item)
            raise

    def cancel(self, item: WorkItem) -> None:
        """Cancel ``item``: drop it if still queued; a running one finishes unseen."""
        if item.future.done():
            return
        if self._queue.remove(item):
            self._queue_changed()
        self._finish(
            item, "cancelled", Cancelled.reason, error=Cancelled("cancelled by the client")
        )

    # -- the scheduling loop ---------------------------------------------------------

    async def _loop(self) -> None:
        while True:
            self._wake.clear()
            now = self._clock.now()
            for item in self._queue.expire(now):
                self._timed_out += 1
                waited_ms = (now - item.arrival) * 1000
                self._finish_error(
                    item,
                    QueueTimeout(
                        f"request timed out in the queue of model {self.model} after "
                        f"{waited_ms:.0f} ms without running; raise its timeout or reduce load"
                    ),
                )
            if len(self._queue) == 0:
                if self._closing:
                    return
                self._set_timer(None)
                await self._wake.wait()
                continue
            if len(self._running) >= max(1, self._executor.instances(self.model)):
                self._set_timer(self._queue.next_deadline())
                await self._wake.wait()
                continue
            decision = decide(self._queue, self._controller.policy(), now, self._arrival_rate())
            if isinstance(decision, Dispatch):
                items = self._queue.take(decision.signature, decision.rows)
                self._queue_changed()
                self._dispatch(items, now)
                continue
            assert decision is not None
            wake_at = decision.until
            deadline = self._queue.next_deadline()
            if deadline is not None:
                wake_at = min(wake_at, deadline)
            self._set_timer(wake_at)
            await self._wake.wait()

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

    def _dispatch(self, items: list[WorkItem], now: float) -> None:
        for item in items:
            item.dispatched_at = now
        task = asyncio.get_running_loop().create_task(self._run_batch(items))
        self._running.add(task)
        task.add_done_callback(self._batch_finished)

    def _batch_finished(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        self._wake.set()

    async def _run_batch(self, items: list[WorkItem]) -> None:
        live = [item for item in items if not item.future.done()]
        if not live:
            return
        t0 = t1 = self._clock.now()
        rows = sum(item.rows for item in live)
        try:
            if len(live) == 1:
                batch = live[0].inputs
            else:
                batch = await assemble(self._executor, self.model, [item.inputs for item in live])
            t1 = self._clock.now()
            outputs = await self._executor.run(self.model, batch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the backend's failure is the requests' failure
            t2 = self._clock.now()
            self._batches += 1
            message = str(exc) if isinstance(exc, SordinoError) else f"{type(exc).__name__}: {exc}"
            error: SordinoError = (
                exc
                if isinstance(exc, SordinoError)
                else InferenceFailed(f"model {self.model} failed on a batch of {rows}: {message}")
            )
            self._batch_observed(rows, len(live), t1 - t0, t2 - t1, 0.0, ok=False)
            for item in live:
                self._finish_error(item, error, compute_s=t2 - t0)
            return
        t2 = self._clock.now()
        offset = 0
        for item in live:
            if len(live) == 1:
                result = outputs
            else:
                result = {name: arr[offset : offset + item.rows] for name, arr in outputs.items()}
            offset += item.rows
            if not item.future.done():
                item.future.set_result(result)
                self._finish(item, "success", "ok", compute_s=t2 - t0)
        t3 = self._clock.now()
        self._batches += 1
        self._batched_rows += rows
        self._batch_observed(rows, len(live), t1 - t0, t2 - t1, t3 - t2, ok=True)

    # -- bookkeeping -----------------------------------------------------------------

    def _finish_error(self, item: WorkItem, error: SordinoError, compute_s: float = 0.0) -> None:
        if item.future.done():
            return
        item.future.set_exception(error)
        # Retrieve it at once so an unawaited future (client gone) logs no warning.
        item.future.exception()
        self._finish(item, "failure", error.reason, compute_s=compute_s)

    def _finish(
        self,
        item: WorkItem,
        outcome: Outcome,
        reason: str,
        *,
        compute_s: float = 0.0,
        error: SordinoError | None = None,
    ) -> None:
        if outcome == "success":
            self._succeeded += 1
        elif outcome == "cancelled":
            self._cancelled += 1
            if error is not None and not item.future.done():
                item.future.cancel()
        else:
            self._failed += 1
        now = self._clock.now()
        started = item.dispatched_at if item.dispatched_at is not None else now
        total = now - item.arrival
        if outcome == "success":
            self._controller.observe(now, total)
        for observer in self._observers:
            observer.request_done(
                self.model,
                outcome,
                reason,
                priority=item.priority,
                queue_s=started - item.arrival,
                compute_s=compute_s,
                total_s=total,
            )

    def _batch_observed(
        self, rows: int, requests: int, input_s: float, infer_s: float, output_s: float, *, ok: bool
    ) -> None:
        for observer in self._observers:
            observer.batch_done(
                self.model,
                rows=rows,
                requests=requests,
                input_s=input_s,
                infer_s=infer_s,
                output_s=output_s,
                ok=ok,
            )

    def _queue_changed(self) -> None:
        for observer in self._observers:
            observer.queue_changed(self.model, len(self._queue))

    def _note_arrival(self, now: float, rows: int) -> None:
        if self._last_arrival is not None:
            gap = max(now - self._last_arrival, 0.0) / max(rows, 1)
            self._gap_ewma = gap if self._gap_ewma is None else 0.8 * self._gap_ewma + 0.2 * gap
        self._last_arrival = now

    def _arrival_rate(self) -> float:
        """Recent rows per second; decays toward zero while nothing arrives."""
        if self._gap_ewma is None or self._last_arrival is None:
            return 0.0
        since = self._clock.now() - self._last_arrival
        gap = max(self._gap_ewma, since)
        return 1.0 / gap if gap > 0 else float("inf")

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
            running_batches=len(self._running),
            queue=self._queue.statistics(),
            controller=self._controller.statistics(),
        )
