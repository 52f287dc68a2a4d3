"""Running one batch: the executor's one call, then each request's rows.

A batch's requests are handed their rows of the outputs (the step state machine takes
them on from there, ``steps.py``); a failed or cancelled batch is answered by
``failures.py``. A decoupled
model's batch (``submit(..., decoupled=True)``) runs through the executor's
``run_decoupled`` with a :class:`~sordino.execution.decoupled.ResponseChannel`: the batch
ends when ``execute`` returned, and each request stays running, getting a
:class:`~sordino.scheduling.work.StepOutput` per response the model sends, until its
final one, an error, the execution timeout or a cancellation (which the channel passes
on to the model).

Tensor ownership (see ``memory/refs.py``): a work item's inputs are released once its
step has run; each step's outputs are handed to the reader of the request's responses,
who releases them.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Sequence

import numpy as np

from sordino.clock import Clock
from sordino.errors import (
    InferenceFailed,
    SordinoError,
    Unsupported,
)
from sordino.execution.batch import BatchContext, Cancels
from sordino.execution.decoupled import ResponseChannel
from sordino.execution.executor import Executor
from sordino.inference import (
    REQUEST_ABSENT,
    REQUEST_APART,
    REQUEST_ERRORS,
    REQUEST_PARAMETERS,
    REQUEST_RESCHEDULED,
    ModelKey,
    RequestFacts,
    decode_request_absent,
    decode_request_apart,
    decode_request_errors,
    decode_request_parameters,
    release_owned,
)
from sordino.memory.refs import Tensors
from sordino.memory.region import StepRegion
from sordino.scheduling.estimate import BatchCost
from sordino.scheduling.failures import BatchFailures
from sordino.scheduling.outcomes import Outcomes
from sordino.scheduling.steps import Steps
from sordino.scheduling.work import Stamps, WorkItem

__all__ = ["BatchRunner", "batch_context"]

_BESIDE_OUTPUTS = (
    REQUEST_ERRORS,
    REQUEST_ABSENT,
    REQUEST_APART,
    REQUEST_PARAMETERS,
    REQUEST_RESCHEDULED,
)
"""The columns a backend gives beside a batch's outputs, about its requests' answers."""


class BatchRunner:
    """Runs one model version's batches on its executor and answers their requests.

    ``cost`` learns what each batch took (the estimates shed and batch by it).
    """

    def __init__(
        self,
        model: ModelKey,
        *,
        executor: Executor,
        clock: Clock,
        cost: BatchCost,
        outcomes: Outcomes,
        steps: Steps,
        ordered: bool = False,
    ) -> None:
        self.model = model
        self.ordered = ordered
        """Answer batches in the order they started (``preserve_ordering``)."""
        # With ``ordered``: done once the batch started last has answered its requests.
        self._last: asyncio.Future[None] | None = None
        self._executor = executor
        self._clock = clock
        self._cost = cost
        self._outcomes = outcomes
        self._steps = steps
        self._failures = BatchFailures(model, clock=clock, outcomes=outcomes, rerun=self.run)
        # Told (by the scheduling loop) that a batch's executor call returned, before its
        # requests are handed their rows: the instance is free for the next batch.
        self.computed: Callable[[], None] | None = None

    async def execute(self, items: list[WorkItem]) -> None:
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
        before = mine = None
        if self.ordered:  # taken before the first await: in the order batches start
            before, mine = self._last, asyncio.get_running_loop().create_future()
            self._last = mine
        try:
            await self.run(live, computed=self.computed if _one_step(live) else None, before=before)
        finally:
            if mine is not None:
                mine.set_result(None)
            for item in live:
                release_owned(item.inputs)

    async def run(
        self,
        live: list[WorkItem],
        *,
        computed: Callable[[], None] | None = None,
        before: asyncio.Future[None] | None = None,
    ) -> None:
        """Run ``live`` (items of requests not ended) as one batch; answer its requests.

        ``computed`` is called once the executor's call returned with outputs, before the
        requests get them (a failed batch's reruns hold the instance until they end).
        ``before``: done once the batch started before this one has answered; its
        requests are answered (or failed) only then (``preserve_ordering``).
        """
        first_request = live[0].request
        if first_request is not None and first_request.decoupled:
            await self._run_decoupled(live)
            return
        t0 = t1 = self._clock.now()
        rows = sum(item.rows for item in live)
        context = batch_context(live)
        cancels = context.cancels
        if cancels is not None:
            # A request cancelled while its batch runs: the model is told (is_cancelled()).
            for index, item in enumerate(live):
                if item.request is not None:
                    item.request.stop = functools.partial(cancels.cancel, index)
        try:
            outputs = await self._executor.run(self.model, [item.inputs for item in live], context)
        except asyncio.CancelledError:
            self._failures.cancelled(live, t0)
            raise
        except Exception as exc:  # the backend's failure is the requests' failure
            _unstop(live, cancels)
            if before is not None:
                await self._after(before, live, t0)
            await self._failures.failed(live, exc, rows, t0, t1)
            return
        _unstop(live, cancels)
        if computed is not None:
            computed()
        t2 = self._clock.now()
        self._cost.note(rows, t2 - t0, t2)
        if before is not None and not before.done():
            try:  # the instance is free meanwhile (computed)
                await self._after(before, live, t0)
            except asyncio.CancelledError:
                outputs.release()
                raise
        errors = absent = apart = parameters = again = None
        if any(name in outputs for name in _BESIDE_OUTPUTS):
            # Some requests' answers are errors (no rows), lack outputs (filler rows),
            # have outputs of their own (not joined) or carry their responses'
            # parameters, or the model runs them again (no rows).
            if REQUEST_RESCHEDULED in outputs:
                again = outputs[REQUEST_RESCHEDULED].reshape(-1)[: len(live)].tolist()
            if REQUEST_ERRORS in outputs:
                errors = decode_request_errors(outputs[REQUEST_ERRORS], len(live))
            if REQUEST_ABSENT in outputs:
                absent = decode_request_absent(outputs[REQUEST_ABSENT], len(live))
            if REQUEST_APART in outputs:
                apart = decode_request_apart(outputs[REQUEST_APART], len(live))
            if REQUEST_PARAMETERS in outputs:
                parameters = decode_request_parameters(outputs[REQUEST_PARAMETERS], len(live))
            answered = Tensors.compose(
                {n: (outputs, n) for n in outputs if n not in _BESIDE_OUTPUTS}
            )
            outputs.release()
            outputs = answered
        with outputs:
            offset = 0
            for index, item in enumerate(live):
                error = errors[index] if errors is not None else None
                if error is not None:
                    self._steps.answered_with_error(item, error, t2 - t0)
                    continue
                if again is not None and again[index] and item.request is not None:
                    self._steps.rescheduled(item.request, t2 - t0)
                    continue
                if len(live) == 1:
                    result = outputs.share()
                else:
                    result = outputs.rows(offset, offset + item.rows)
                offset += item.rows
                if absent is not None and absent[index]:
                    result = _without(result, absent[index])
                if apart is not None and (own := apart[index]):
                    result = _with(result, own)
                if parameters is not None:
                    result.parameters = parameters[index]
                request = item.request
                if request is not None and request.trace is not None:
                    _stamp_compute(request.trace, (t0, t1, t2, self._clock.now()))
                self._steps.update_from_output(item, result, t2 - t0, t2)
        t3 = self._clock.now()
        self._outcomes.batches += 1
        self._outcomes.batched_rows += rows
        self._outcomes.batch_observed(rows, len(live), t1 - t0, t2 - t1, t3 - t2, ok=True)

    async def _after(self, before: asyncio.Future[None], live: list[WorkItem], t0: float) -> None:
        """Wait until the batch started before ``live``'s has answered; a cancellation
        meanwhile (the scheduler stopping) ends ``live``'s requests as cancelled."""
        try:
            await asyncio.shield(before)
        except asyncio.CancelledError:
            self._failures.cancelled(live, t0)
            raise

    async def _run_decoupled(self, live: list[WorkItem]) -> None:
        """Run a decoupled model's batch; its requests are answered as the model sends."""
        t0 = self._clock.now()
        rows = sum(item.rows for item in live)
        requests = [item.request for item in live]

        def respond(index: int, outputs: dict[str, np.ndarray] | SordinoError, final: bool) -> None:
            request = requests[index]
            if request is None or request.finished:
                return
            if isinstance(outputs, SordinoError):
                self._steps.decoupled_error(request, outputs, final)
            elif REQUEST_RESCHEDULED in outputs:  # the model runs it again (its final word here)
                self._outcomes.unanswered(request)
                self._steps.rescheduled(request, 0.0)
            else:
                self._steps.decoupled_response(request, outputs, final)

        def fail(index: int, message: str) -> None:
            request = requests[index]
            if request is not None:
                self._outcomes.fail(request, InferenceFailed(message))

        channel = ResponseChannel(str(self.model), len(live), respond, fail)
        for index, request in enumerate(requests):
            if request is not None:
                request.stop = functools.partial(channel.cancel, index)
                self._outcomes.answering(request)
        run = getattr(self._executor, "run_decoupled", None)
        try:
            if run is None:
                raise Unsupported(
                    f"model {self.model} is decoupled (it sends its own responses); this "
                    "executor cannot run such a model: serve it with isolation process or thread"
                )
            await run(self.model, [item.inputs for item in live], channel, batch_context(live))
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
                    self._outcomes.fail(request, error)
            self._outcomes.batches += 1
            self._outcomes.batch_observed(
                rows, len(live), 0.0, self._clock.now() - t0, 0.0, ok=False
            )
            return
        finally:
            for item in live:
                if item.request is not None and item.request.item is item:
                    item.request.item = None  # (not a rescheduled request's next step)
        t2 = self._clock.now()
        self._cost.note(rows, t2 - t0, t2)
        self._outcomes.batches += 1
        self._outcomes.batched_rows += rows
        for request in requests:
            if request is not None:
                request.compute_s += t2 - t0
        self._outcomes.batch_observed(rows, len(live), 0.0, t2 - t0, 0.0, ok=True)


def _one_step(live: Sequence[WorkItem]) -> bool:
    """Whether every request of the batch ends with it (no next step to queue first)."""
    for item in live:
        request = item.request
        if request is not None and (
            request.stream is not None or request.stepper is not None or request.again is not None
        ):
            return False
    return True


def _unstop(live: Sequence[WorkItem], cancels: Cancels | None) -> None:
    """The batch ran: its requests' ends no longer concern the model."""
    if cancels is not None:
        for item in live:
            if item.request is not None:
                item.request.stop = None


def batch_context(live: Sequence[WorkItem]) -> BatchContext:
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


def _without(result: Tensors, names: Sequence[str]) -> Tensors:
    """``result`` less the outputs ``names`` (its request's response lacked them)."""
    kept = Tensors.compose({n: (result, n) for n in result if n not in names})
    result.release()
    return kept


def _with(result: Tensors, own: list[tuple[int, str, np.ndarray]]) -> Tensors:
    """``result`` and the outputs ``own`` that are its request's alone (not joined), each
    at its place among the model's outputs (``result`` holds the others in order)."""
    extra = Tensors.of({name: array for _, name, array in own})
    names: list[tuple[Tensors, str]] = [(result, n) for n in result]
    for place, name, _ in own:  # by place, so each lands where the model declares it
        names.insert(min(place, len(names)), (extra, name))
    kept = Tensors.compose({n: (source, n) for source, n in names})
    result.release()
    return kept


_COMPUTE = ("COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END")


def _stamp_compute(trace: Stamps, moments: tuple[float, ...]) -> None:
    """A traced request's batch: begun, staged, back from the model, split (the
    scheduler's clock: ``time.monotonic`` in a server, as the trace's)."""
    for name, moment in zip(_COMPUTE, moments, strict=True):
        trace.stamp(name, int(moment * 1e9))
