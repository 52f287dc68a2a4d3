"""The step state machine: what one step's outputs do to their request.

After a step ran, its request either ends (its final response, a stream that set its
``done`` output, an iterative model's last sample) or is queued again for its next
step: a stream's carried outputs become inputs (they stay in the arena), an iterative
model's :class:`~sordino.scheduling.work.Stepper` computes the next step's inputs (or
ends the request: a generation past its deadline raises a ``QueueTimeout``, counted
among the timed out). A
decoupled model's requests get a response each time the model sends one. Between steps
the state waits in the queue, parked (see ``parking.py``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

import numpy as np

from sordino.clock import Clock
from sordino.errors import (
    InferenceFailed,
    QueueTimeout,
    ShuttingDown,
    SordinoError,
    StreamBacklogFull,
)
from sordino.inference import (
    REQUEST_PARAMETERS,
    ModelKey,
    StreamSpec,
    Tensor,
    decode_request_parameters,
)
from sordino.memory.refs import Tensors
from sordino.scheduling.modes import ModeController
from sordino.scheduling.outcomes import Outcomes, discard_outputs
from sordino.scheduling.queue import RequestQueue
from sordino.scheduling.work import Request, StepOutput, WorkItem, signature_of

__all__ = ["Steps"]

log = logging.getLogger("sordino.scheduler")


class Steps:
    """Takes each of one model version's requests from one step to the next.

    ``controller`` is the scheduler's current one (a hot reconfiguration replaces it
    here too); ``wake`` tells the scheduling loop a step was queued. Once ``aborting``
    (a close without drain), a request's next step fails instead of being queued.
    """

    def __init__(
        self,
        model: ModelKey,
        *,
        batched: bool,
        queue: RequestQueue,
        clock: Clock,
        controller: ModeController,
        outcomes: Outcomes,
        wake: Callable[[], None],
    ) -> None:
        self.model = model
        self.batched = batched
        self.controller = controller
        self.aborting = False
        self._queue = queue
        self._clock = clock
        self._outcomes = outcomes
        self._wake = wake

    def work_item(self, request: Request, inputs: Tensors, now: float) -> WorkItem:
        """The step of ``request`` that runs on ``inputs``, queued at ``now``: its item."""
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

    def answered_with_error(self, item: WorkItem, error: SordinoError, compute_s: float) -> None:
        """The model answered ``item``'s request with ``error`` (its batch ran): the
        request ends with it, as its answer; its step counts as computed."""
        request = item.request
        if request is None or request.finished:
            return  # cancelled while it ran
        request.item = None
        request.steps += 1
        request.compute_s += compute_s
        self._outcomes.fail(request, error)

    def update_from_output(
        self, item: WorkItem, result: Tensors, compute_s: float, done_at: float | None = None
    ) -> None:
        """Deliver one step's ``result`` to its request; queue the next step or finish.

        ``done_at`` is when the batch's outputs were in hand, read once a batch: the
        time the request's latency and end are counted at (an iterative request reads
        the clock itself, after the samplers of the requests before it ran)."""
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
        now = self._clock.now() if done_at is None or request.stepper is not None else done_at
        self.controller.observe(now, now - item.arrival, backlog_rows=self._queue.rows)
        if request.stepper is not None:
            self._advance(request, result, now)
            return
        spec = request.stream
        final = spec is None or _stream_done(result, spec)
        if not final and request.steps >= request.max_steps:
            assert spec is not None
            result.release()
            self._outcomes.fail(
                request,
                InferenceFailed(
                    f"model {self.model} streamed {request.steps} responses without setting "
                    f"{spec.done!r}; raise streaming.max_steps or fix the model"
                ),
            )
            return
        if not final:
            assert spec is not None
            if self.aborting:
                result.release()
                self._outcomes.fail(request, ShuttingDown("the model is being unloaded"))
                return
            # ``carry`` maps an output to the input it feeds on the next step.
            by_input = {target: source for source, target in spec.carry}
            parts = {
                name: (result, by_input[name]) if name in by_input else (request.inputs, name)
                for name in request.inputs
            }
            self._queue_next(request, Tensors.compose(parts), now)
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
            self._outcomes.finish(request, "success", "ok", now)

    def rescheduled(self, request: Request, compute_s: float) -> None:
        """The model asked to run ``request`` again in a later batch (Triton's request
        rescheduling): its step counts as computed, and it is queued again at its
        priority on its own inputs, ``again``'s in their place, its flags 0."""
        if request.finished:
            return
        request.item = None
        request.steps += 1
        request.compute_s += compute_s
        again = request.again
        if again is None:  # (its backend answers such a request with an error itself)
            self._outcomes.fail(
                request,
                InferenceFailed(
                    f"model {self.model} asked to run a request again, but it is not "
                    "configured for it (sequence_batching { iterative_sequence: true })"
                ),
            )
            return
        if self.aborting:
            self._outcomes.fail(request, ShuttingDown("the model is being unloaded"))
            return
        facts = request.facts
        if facts is not None and facts.flags:
            request.facts = dataclasses.replace(facts, flags=0)
        inputs = request.inputs
        if again:
            fresh = Tensors.of(again)
            parts = {name: (fresh if name in again else inputs, name) for name in inputs}
            following = Tensors.compose(parts)
        else:
            following = inputs.share()
        self._queue_next(request, following, self._clock.now())

    def _queue_next(self, request: Request, inputs: Tensors, now: float) -> None:
        """Queue ``request``'s next step on ``inputs`` (a stream's carried state, a
        generation's next sample, a request run again), by its priority. They wait in the
        queue parked: defragmentation may move them."""
        self._queue.put_nowait(self.work_item(request, inputs, now), force=True)
        inputs.park()
        request.state = "queued"
        self._outcomes.queue_changed()
        self._wake()

    def _advance(self, request: Request, result: Tensors, now: float) -> None:
        """An iterative request's step ran: let its stepper compute the next one."""
        assert request.stepper is not None
        try:
            with result:
                following, delivered = request.stepper.advance(result, now)
        except SordinoError as exc:
            if isinstance(exc, QueueTimeout):
                self._outcomes.timed_out += 1  # a generation ended at its deadline
            self._outcomes.fail(request, exc)
            return
        except Exception as exc:  # a bug in the sampler is this request's failure
            self._outcomes.fail(
                request, InferenceFailed(f"the sampler of {self.model} failed: {exc}")
            )
            return
        final = following is None
        if following is not None:
            if self.aborting:
                following.release()
                if delivered is not None:
                    delivered.release()
                self._outcomes.fail(request, ShuttingDown("the model is being unloaded"))
                return
            # The request's next step: queued by its priority, so a higher-priority
            # request's steps go first and this one resumes from its state (kept in
            # ``following``, in the arena) when its turn comes.
            request.inputs.release()
            request.inputs = following.share() if following.leases else following
            # The state waits in the queue, parked (the stepper keeps its own copy of the
            # sample, never an array taken from ``following``).
            self._queue_next(request, following, now)
            request.inputs.park()
        if delivered is not None:
            request.outputs.put_nowait(StepOutput(delivered, final, request.steps))
        if final:
            self._outcomes.finish(request, "success", "ok")

    def decoupled_response(
        self, request: Request, outputs: dict[str, np.ndarray], final: bool
    ) -> None:
        """One response a decoupled model sent ``request``; a bare final flag ends it.
        Its parameters, given beside its outputs (``REQUEST_PARAMETERS``), go with them."""
        request.steps += 1
        given = outputs.pop(REQUEST_PARAMETERS, None) if REQUEST_PARAMETERS in outputs else None
        why = request.outputs.overflow(outputs)
        if why is not None:  # its client is too far behind: cut it, not the server
            log.warning("model %s: request %s: %s", self.model, request.id or "(no id)", why)
            discard_outputs(request)
            self._outcomes.fail(request, StreamBacklogFull(f"model {self.model}: {why}"))
            return
        if outputs or given is not None:
            tensors = Tensors.of(outputs)
            if given is not None:
                tensors.parameters = decode_request_parameters(given, 1)[0]
            request.outputs.put_nowait(StepOutput(tensors, final, request.steps))
        elif final:
            request.outputs.put_nowait(StepOutput(Tensors.of({}), True, request.steps, empty=True))
        if final:
            self._outcomes.finish(request, "success", "ok")

    def decoupled_error(self, request: Request, error: SordinoError, final: bool) -> None:
        """An error response a decoupled model sent ``request``: its end when ``final``,
        else one response of its stream (the request goes on)."""
        if final:
            self._outcomes.fail(request, error)
            return
        request.steps += 1
        request.outputs.put_nowait(StepOutput(Tensors.of({}), False, request.steps, error=error))


def _nbytes(tensors: Mapping[str, Tensor]) -> int:
    return sum(int(array.nbytes) for array in tensors.values())


def _stream_done(outputs: Tensors, spec: StreamSpec) -> bool:
    return bool(np.all(outputs[spec.done]))
