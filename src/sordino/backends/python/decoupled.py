"""Response senders for a Triton Python model: decoupled streams, and the one-response kind.

A decoupled model (``model_transaction_policy { decoupled: true }``) gets, with each
request, an :class:`~.triton_python_backend_utils.InferenceResponseSender` whose
``send`` hands the response to the :class:`~sordino.backends.decoupled.Responder` at
once, from whatever thread the model sends on; ``execute`` must return None (Triton's
rule and message). If ``execute`` raises, every request without its final response
gets the error and its sender is closed, so later sends raise, as in Triton.

A model that is not decoupled may also answer through the sender (Triton 24.10): one
response per request, sent before ``execute`` returns; ``execute`` then returns None, or
None in that request's place. :func:`collect_sent` gives each request such a sender and
:func:`sent_responses` reads what they sent.

A decoupled model's inputs are copies, not views of the arena: its threads may read
them after ``execute`` returned, when the batch's arena blocks have gone back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from sordino.backends.calls import ModelCaller
from sordino.backends.decoupled import Responder
from sordino.backends.python import bls
from sordino.backends.python import triton_python_backend_utils as utils
from sordino.backends.python.joining import triton_code
from sordino.backends.reshape import Reshapes
from sordino.datatypes import from_numpy_dtype
from sordino.inference import REQUEST_PARAMETERS, REQUEST_RESCHEDULED, Tensor

__all__ = ["collect_sent", "execute_decoupled", "sent_responses"]


class _Sent:
    """The one response a sender of a non-decoupled model's request sent (or None)."""

    __slots__ = ("final", "response")

    def __init__(self) -> None:
        self.response: utils.InferenceResponse | None = None
        self.final = False

    def __call__(self, response: utils.InferenceResponse | None, final: bool) -> None:
        if response is not None:
            self.response = response
        self.final = self.final or final


class _Senders:
    """The senders of a non-decoupled model's requests, each made when its request is
    first asked for it (``get_response_sender()``): most models return their responses,
    and a batch then makes none. ``sent[i]`` is where request ``i``'s sender's response
    goes, None while it has no sender."""

    __slots__ = ("sent",)

    def __init__(self, count: int) -> None:
        self.sent: list[_Sent | None] = [None] * count

    def __call__(self, request: utils.InferenceRequest) -> utils.InferenceResponseSender:
        # The index collect_sent gave it (no reference from here back to the requests:
        # they hold arena views, which must go when the batch ends, not at a GC pass).
        sent = self.sent[request._sordino_index] = _Sent()
        return utils.InferenceResponseSender(sent, request._cancelled, decoupled=False)


def collect_sent(requests: Sequence[utils.InferenceRequest]) -> _Senders:
    """Give each request of a non-decoupled model a sender (made on first use); return
    where each one's goes."""
    senders = _Senders(len(requests))
    for index, request in enumerate(requests):
        request._sordino_index = index
        request._make_sender = senders
    return senders


def sent_responses(returned: Any, collected: _Senders) -> Any:
    """``execute``'s return with the responses sent through senders in the places of None.

    ``returned`` None means every request answered through its sender. Anything else
    is returned as it is, for the caller's checks.
    """
    sent = collected.sent
    if not any(s is not None and s.response is not None for s in sent):
        return returned
    if returned is None:
        returned = [None] * len(sent)
    if not isinstance(returned, list | tuple) or len(returned) != len(sent):
        return returned
    return [
        (s.response if s is not None else None) if given is None else given
        for given, s in zip(returned, sent, strict=True)
    ]


def _outputs(
    response: utils.InferenceResponse, declared: Mapping[str, str], name: str
) -> dict[str, np.ndarray]:
    """The response's tensors, each a declared output of its declared datatype; else the
    model's send raises, saying which (a response is checked as it is sent, not later)."""
    outputs = {}
    parameters = getattr(response, "parameters", lambda: "{}")()
    if parameters != "{}":  # carried beside the outputs to the response's answer
        outputs[REQUEST_PARAMETERS] = np.array([parameters.encode()], dtype=np.object_)
    for tensor in response.output_tensors():
        array = np.asarray(tensor.as_numpy())
        datatype = declared.get(tensor.name())
        if datatype is None:
            raise utils.TritonModelException(
                f"model {name}: output {tensor.name()!r} is not among its configured outputs "
                f"({', '.join(declared)})"
            )
        given = from_numpy_dtype(array.dtype) if array.dtype.kind not in "OSU" else "BYTES"
        if given != datatype:
            raise utils.TritonModelException(
                f"model {name}: output {tensor.name()!r} is {given} ({array.dtype}), but the "
                f"configuration says {datatype}"
            )
        outputs[tensor.name()] = array
    return outputs


def execute_decoupled(
    model: Any,
    name: str,
    batch: dict[str, Tensor],
    rows: Sequence[int],
    batched: bool,
    responder: Responder,
    declared: Mapping[str, str],
    *,
    request_for: Callable[[int, list[utils.Tensor]], utils.InferenceRequest],
    caller: ModelCaller | None = None,
    reshapes: Reshapes | None = None,
    iterative: bool = False,
) -> None:
    """Call a decoupled model's ``execute`` with one request per entry of ``rows``.

    Each request's sender forwards to ``responder``; raises (naming the model) when
    ``execute`` raised or returned something other than None, after closing the senders
    of the requests that had not finished. ``declared`` maps each output to its datatype.
    ``request_for(index, tensors)`` builds request ``index`` (with its facts); BLS calls
    made meanwhile go through ``caller`` and carry those requests' facts. ``reshapes``:
    tensors the model takes and gives in another shape than clients (Triton's
    ``reshape``). A request the model rescheduled before ``execute`` returned
    (``iterative``: the model may) gets a last response that says so
    (:data:`~sordino.inference.REQUEST_RESCHEDULED` alone); one of a model that may not,
    the error saying why.
    """
    if reshapes:
        batch = reshapes.inputs_to_model(batch)
    counts = list(rows) if batched and len(rows) > 1 else []
    requests: list[utils.InferenceRequest] = []
    senders: list[utils.InferenceResponseSender] = []
    start = 0
    for index, count in enumerate(counts or [-1]):
        # Copies: the model's threads may read them after the arena blocks went back.
        part = {n: np.array(a if count < 0 else a[start : start + count]) for n, a in batch.items()}
        start += max(count, 0)
        request = request_for(index, [utils.Tensor(n, a) for n, a in part.items()])
        request._cancelled = _asker(responder, index)
        sender = utils.InferenceResponseSender(
            _emitter(responder, index, declared, name, reshapes),
            request._cancelled,
            decoupled=True,
        )
        request._sender = sender
        requests.append(request)
        senders.append(sender)
    try:
        with bls.executing(bls.Executing(name, requests, caller=caller)):
            returned = model.execute(requests)
        if returned is not None:
            raise utils.TritonModelException(
                f"Python model '{name}' is using the decoupled mode and the execute "
                "function must return None."
            )
    except BaseException:
        # Triton closes every sender once execute failed: the error answers them.
        for sender in senders:
            sender.close()
        raise
    for index in rescheduled(requests):
        senders[index].close()  # its next run has a sender of its own
        if iterative:
            responder.respond(index, {REQUEST_RESCHEDULED: _AGAIN}, True)
        else:
            code, message = not_iterative(name)
            responder.respond(index, None, True, message, code)


_AGAIN = np.ones(1, dtype=np.uint8)


def rescheduled(requests: Sequence[utils.InferenceRequest]) -> list[int]:
    """The indices of the requests the model asked to run again (Triton's
    ``set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)``)."""
    flag = utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
    return [index for index, request in enumerate(requests) if request._release_flags & flag]


def not_iterative(name: str) -> tuple[int, str]:
    """The error (Triton's code, the message) of a request rescheduled by a model that
    may not (Triton logs it and leaves the request unanswered)."""
    return (
        utils.TritonError.INTERNAL,
        f"model {name} asked to run a request again (set_release_flags("
        "TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)), but it is not configured to handle such "
        "a flag: give it sequence_batching { iterative_sequence: true }",
    )


def _asker(responder: Responder, index: int) -> Any:
    return lambda: responder.cancelled(index)


def _emitter(
    responder: Responder,
    index: int,
    declared: Mapping[str, str],
    name: str,
    reshapes: Reshapes | None = None,
) -> Any:
    def emit(response: utils.InferenceResponse | None, final: bool) -> None:
        if response is not None and response.has_error():
            # One response of the stream, as on Triton: the request goes on unless final.
            error = response.error()
            message, code = (
                (error.message(), triton_code(error)) if error is not None else ("error", 1)
            )
            responder.respond(index, None, final, message, code)
            return
        outputs = _outputs(response, declared, name) if response is not None else None
        if outputs is not None and reshapes is not None and reshapes.outputs:
            reshapes.outputs_to_client(outputs)
        responder.respond(index, outputs, final)

    return emit
