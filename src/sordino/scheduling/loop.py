"""The scheduling loop: one task per model version that decides when batches run.

Each turn is vLLM's **schedule** step: expire queued work past its deadline, then let
the batcher decide — run a batch now (taking compatible work items from the priority
queue, as many rows as the arena holds, none that cannot meet its deadline) or wait.
A batch to run becomes a task of its own (**execute**, ``batches.py``), so several
batches run at once when the model has several instances.

The loop waits on a single wake-up event, set when work arrives, when a batch ends
while work is queued (or the loop is closing), when a timer for the batch delay or the
next deadline fires, or on close. It never polls.

An arrival that finds the task idle (waiting on the event, nothing else having woken
it) takes its turn as a plain callback instead (:meth:`SchedulingLoop.arrived`): the
same ``_schedule`` at the same point of the event loop — after everything already
ready to run, so a burst handed over in one step still batches together — without
waking the task for it and without the task's second look at a queue it just emptied.
At one request in flight that is every request.
"""

from __future__ import annotations

import asyncio
import contextvars

from sordino.clock import Clock, TimerHandle
from sordino.errors import QueueTimeout
from sordino.execution.executor import Executor
from sordino.inference import ModelKey
from sordino.scheduling.batcher import Dispatch, decide
from sordino.scheduling.batches import BatchRunner
from sordino.scheduling.estimate import BatchCost
from sordino.scheduling.modes import ModeController
from sordino.scheduling.outcomes import Outcomes
from sordino.scheduling.overflow import Overflow
from sordino.scheduling.parking import unpark
from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.shedding import Shedder
from sordino.scheduling.work import WorkItem

__all__ = ["SchedulingLoop"]


class SchedulingLoop:
    """The task that schedules one model version's batches, and the batches running.

    ``controller`` is the scheduler's current one (a hot reconfiguration replaces it
    here too); ``wake`` is the event every part sets to make the loop look again. Once
    ``closing``, the loop ends when the queue is empty and no batch runs.
    """

    def __init__(
        self,
        model: ModelKey,
        *,
        executor: Executor,
        queue: RequestQueue,
        clock: Clock,
        controller: ModeController,
        wake: asyncio.Event,
        outcomes: Outcomes,
        shedder: Shedder,
        overflow: Overflow,
        cost: BatchCost,
        runner: BatchRunner,
    ) -> None:
        self.model = model
        self.controller = controller
        self.closing = False
        self._executor = executor
        self._queue = queue
        self._clock = clock
        self._wake = wake
        self._outcomes = outcomes
        self._shedder = shedder
        self._overflow = overflow
        self._cost = cost
        self._runner = runner
        self._timer: TimerHandle | None = None
        self._timer_at: float | None = None
        self._task: asyncio.Task[None] | None = None
        self._context = contextvars.copy_context()  # the task's (and its batches')
        self._idle = False  # the task waits on the event (set just before it does)
        self._turn_soon = False  # an arrival's turn is scheduled (a callback or a task)
        self._arrival: asyncio.Task[None] | None = None
        self._running: set[asyncio.Task[None]] = set()
        # The running batches whose executor call has not returned: each holds an instance.
        self._holding: set[asyncio.Task[None]] = set()
        self._started: dict[asyncio.Task[None], float] = {}
        runner.computed = self._computed

    def start(self) -> None:
        """Start the scheduling task in the running event loop."""
        if self._task is None:
            self._context = contextvars.copy_context()
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"sordino-scheduler-{self.model}", context=self._context
            )

    def arrived(self) -> None:
        """Work was queued: make the loop look at the queue.

        When the task waits idle, the look is scheduled where the task's wake-up would
        be (the next event-loop step, after what is ready now) and runs the turn the
        task would run, starting a batch or arming a timer; it hands on to the task
        only when work is left that another batch may take. Where an instance is free
        the look is the first step of a new task that runs the batch it starts (no
        step to start one more); with none free, a plain callback. Otherwise the event
        is set as for any other wake-up.
        """
        if self._turn_soon:
            return
        if not self._idle or self.closing or self._wake.is_set():
            self._wake.set()
            return
        self._turn_soon = True
        loop = asyncio.get_running_loop()
        # A batch task that ended has its done callback queued ahead of this turn.
        running = sum(1 for task in self._holding if not task.done())
        if running >= max(1, self._executor.instances(self.model)):
            loop.call_soon(self._arrival_turn, context=self._context)
        else:  # in a copy of the loop's context, as every batch task
            # Held until its first step; then it is among the running (or done).
            self._arrival = loop.create_task(
                self._arrival_batch(), name="sordino-batch", context=self._context.copy()
            )
            self._arrival.add_done_callback(self._arrival_ended)

    def _arrival_ended(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() and self._turn_soon:
            # Cancelled before its first step (the event loop closing): its turn never
            # came, and no look may be left owed to the queue.
            self._turn_soon = False
            self._wake.set()

    def _arrival_turn(self) -> None:
        batch, now = self._arrival_look()
        if batch is not None:
            self._start(batch, now)

    async def _arrival_batch(self) -> None:
        batch, now = self._arrival_look()
        if batch is None:
            return
        task = asyncio.current_task()
        assert task is not None
        self._prepare(batch, now)
        self._track(task, now)
        await self._runner.execute(batch)

    def _arrival_look(self) -> tuple[list[WorkItem] | None, float]:
        """An arrival's turn: the batch to start now (and when), or None."""
        self._turn_soon = False
        now = self._clock.now()
        if not self._idle or self.closing or self._wake.is_set():
            self._wake.set()  # the task takes (or has taken) the turn itself
            return None, now
        batch = self._schedule(now)
        if batch is None:
            return None, now  # a timer is set (or the queue is empty): the task waits on
        if len(self._queue):
            self._wake.set()  # the task's next look: another batch may take the rest
        else:
            self._set_timer(None)  # what the task's next look at an empty queue does
        return batch, now

    def cancel_running(self) -> None:
        """Cancel every batch running (a close without drain)."""
        for task in self._running:
            task.cancel()

    async def join(self) -> None:
        """Wait for the loop to end (set ``closing`` and wake it first), then for the
        batches still running."""
        if self._task is not None:
            await self._task
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    def cancel_timer(self) -> None:
        """Cancel the pending wake-up timer, if any (the loop has ended)."""
        if self._timer is not None:
            self._timer.cancel()

    @property
    def running_batches(self) -> int:
        """Batches running now."""
        return len(self._running)

    def running_for(self) -> float:
        """Seconds the longest-running batch has been running (0 with none running).

        Readiness reads it: a batch running far longer than any may (the execution
        timeout, a restart, the wait for arena space) means the model is wedged.
        """
        if not self._started:
            return 0.0
        return max(0.0, self._clock.now() - min(self._started.values()))

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            now = self._clock.now()
            batch = self._schedule(now)
            if batch is None:
                if self.closing and len(self._queue) == 0 and not self._running:
                    return
                self._idle = True
                try:
                    await self._wake.wait()
                finally:
                    self._idle = False
                continue
            self._start(batch, now)

    def _start(self, batch: list[WorkItem], now: float) -> None:
        """Start ``batch`` as a task of its own, counted among the running."""
        self._prepare(batch, now)
        # In a copy of the loop's context (the task's, or an arrival turn's run in it;
        # a batch that came free runs this in its own, a copy of the same).
        context = self._context.copy()
        task = asyncio.get_running_loop().create_task(self._runner.execute(batch), context=context)
        self._track(task, now)

    def _prepare(self, batch: list[WorkItem], now: float) -> None:
        """``batch`` left the queue to run now: its items are running."""
        self._outcomes.queue_changed()
        for item in batch:
            unpark(item.inputs)  # about to be read: pinned where it lies
            item.dispatched_at = now
            if item.request is not None:
                item.request.state = "running"
                item.request.queue_s += now - item.arrival

    def _track(self, task: asyncio.Task[None], now: float) -> None:
        """Count ``task``, a batch started ``now``, among the running until it ends."""
        self._running.add(task)
        self._holding.add(task)
        self._started[task] = now
        task.add_done_callback(self._batch_finished)

    def _computed(self) -> None:
        """The running batch's executor call returned: its instance is free now.

        Called from the batch's task before its requests are handed their rows. Work
        queued meanwhile starts here, ahead of those requests' answers and of what the
        event loop reads next, so the model computes the next batch while this one's
        answers are encoded and written. Waiting for the batch task to end instead puts
        the next batch behind all of that: the instance stands idle while the loop
        works, and the loop then waits for the instance (two batches of a closed loop
        take turns instead of overlapping).
        """
        task = asyncio.current_task()
        if task is None or task not in self._holding:
            return
        self._holding.discard(task)
        if self.closing or self._turn_soon or len(self._queue) == 0:
            return  # nothing to start, or a turn is already on its way
        if not self._idle or self._wake.is_set():
            self._wake.set()
            return
        batch, now = self._arrival_look()
        if batch is not None:
            self._start(batch, now)

    def _schedule(self, now: float) -> list[WorkItem] | None:
        """Return the work items to run as one batch now, or None (a timer is set)."""
        expired = self._queue.expire(now)
        if expired:
            self._outcomes.queue_changed()  # the observers see the queue without them
        for item in expired:
            self._outcomes.timed_out += 1
            waited_ms = (now - item.arrival) * 1000
            self._outcomes.drop(
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
        if len(self._holding) >= instances:
            self._set_timer(self._queue.next_deadline())
            return None
        # With another instance idle besides the one this batch takes, waiting to fill
        # it would leave that capacity unused: run now (no arrivals expected).
        rate = self._shedder.arrival_rate() if len(self._holding) + 1 >= instances else 0.0
        decision = decide(self._queue, self.controller.policy(), now, rate)
        if isinstance(decision, Dispatch):
            rows = self._overflow.rows_that_fit(decision)
            batch = self._shedder.drop_hopeless(
                self._queue.take(decision.signature, rows, self._cost.ride_along), now
            )
            if not batch:
                # Every item was hopeless: they left the queue (tell the observers) and
                # the loop looks at the queue again at once.
                self._outcomes.queue_changed()
                self._wake.set()
                return None
            return batch
        assert decision is not None
        wake_at = decision.until
        deadline = self._queue.next_deadline()
        if deadline is not None:
            wake_at = min(wake_at, deadline)
        self._set_timer(wake_at)
        return None

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
        self._holding.discard(task)
        self._started.pop(task, None)
        # An instance came free: the loop looks again only when that can change
        # something — queued work may run now, or a close waits for the last batch.
        # With nothing queued a turn would only find the queue empty: one event-loop
        # step per batch (each request at 1 in flight) saved; an arrival wakes it. An
        # arrival's turn already scheduled looks itself (the next request of a client
        # answered by this batch may be queued before this callback runs).
        if self.closing or (len(self._queue) and not self._turn_soon):
            self._wake.set()
