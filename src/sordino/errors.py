"""The one error hierarchy of sordino.

Every error a client or an operator can see is one of these. ``protocol/status.py``
is the only place that turns them into HTTP statuses and gRPC codes; the messages
are written for the person who has to fix the problem, so they name the offending
value and what would have been accepted.

::

    SordinoError
    ├── ConfigError                  bad configuration (start-up stops)
    ├── ModelLoadError               a model file or repository entry cannot be loaded
    ├── InvalidRequest               400: the request itself is wrong
    │   ├── MalformedBody            not JSON, bad binary framing, body too large (413)
    │   └── TensorError              wrong datatype, shape, element count, tensor name
    ├── NotFound                     404: unknown model, version, or route
    ├── Unauthenticated              401: a protected endpoint without the admin token
    ├── Forbidden                    403: a protected endpoint that is off (no admin token)
    ├── Conflict                     409: another change is in progress (Retry-After)
    ├── Unavailable                  503: the server cannot take it now
    │   ├── ModelNotReady            model loading, draining or unloaded
    │   ├── QueueFull                the queue is at its limit (Retry-After)
    │   │   └── Shed                 the work ahead would make it miss its deadline
    │   ├── QueueTimeout             the request's deadline passed while it waited
    │   │   └── DeadlineExceeded     a running generation ended at its deadline
    │   ├── ShuttingDown             the server is stopping
    │   │   └── Replaced             the version was reloaded before the request queued
    │   └── OutOfMemory              the shared-memory arena cannot hold the tensors now
    ├── RateLimited                  429: a rate limit (Retry-After)
    ├── Unsupported                  400: a feature that is configured or asked for but not
    │                                implemented; never silently ignored
    ├── Cancelled                    the client cancelled the request
    ├── InferenceFailed              500: the batch failed (worker lost, every device failed)
    │   └── ModelError               the model itself raised on the batch's inputs
    └── ModelResponseError           the model answered this request with an error
        │                            (Triton's code gives the status: 500, 503, 501)
        └── ModelRejected            ... of the client's kind (400, 404)
"""

from __future__ import annotations

__all__ = [
    "Cancelled",
    "ConfigError",
    "Conflict",
    "DeadlineExceeded",
    "Forbidden",
    "InferenceFailed",
    "InvalidRequest",
    "MalformedBody",
    "ModelError",
    "ModelLoadError",
    "ModelNotReady",
    "ModelRejected",
    "ModelResponseError",
    "NotFound",
    "OutOfMemory",
    "QueueFull",
    "QueueTimeout",
    "RateLimited",
    "Replaced",
    "Shed",
    "ShuttingDown",
    "SordinoError",
    "StreamBacklogFull",
    "TensorError",
    "Unauthenticated",
    "Unavailable",
    "Unsupported",
    "model_response_error",
]


class SordinoError(Exception):
    """Base of every error sordino raises on purpose.

    ``reason`` is a short machine-readable label used as a metrics label value.
    """

    reason: str = "error"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(SordinoError):
    """The configuration is invalid; the message names the key, the value and what is allowed."""

    reason = "config"


class ModelLoadError(SordinoError):
    """A model could not be loaded from disk."""

    reason = "model_load"


class InvalidRequest(SordinoError):
    """The request is wrong and retrying it unchanged cannot succeed."""

    reason = "invalid_request"


class MalformedBody(InvalidRequest):
    """The body cannot be parsed: bad JSON, bad binary framing, or too large."""

    reason = "malformed_body"

    def __init__(self, message: str, *, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


class TensorError(InvalidRequest):
    """A tensor does not match the model: name, datatype, shape or element count."""

    reason = "bad_tensor"


class NotFound(SordinoError):
    """The model, version or resource does not exist."""

    reason = "not_found"


class Unauthenticated(SordinoError):
    """A protected endpoint was called without the admin token, or with a wrong one."""

    reason = "unauthenticated"


class Forbidden(SordinoError):
    """A protected endpoint is off for this caller: no admin token is configured."""

    reason = "forbidden"


class Conflict(SordinoError):
    """The request conflicts with one still in progress (a configuration change being
    verified); retry after ``retry_after_s``."""

    reason = "conflict"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Unavailable(SordinoError):
    """The server cannot take the request now; a later retry may succeed."""

    reason = "unavailable"
    retry_after_s: float | None = None


class ModelNotReady(Unavailable):
    """The model exists but is not serving (loading, draining, unloaded)."""

    reason = "model_not_ready"


class QueueFull(Unavailable):
    """The model's queue is at its configured limit."""

    reason = "queue_full"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Shed(QueueFull):
    """Refused at arrival: the work queued ahead would make the request miss its deadline.

    Lower priorities are shed first, since only the work at the same or a higher
    priority is ahead of a request.
    """

    reason = "shed"


class QueueTimeout(Unavailable):
    """The request's deadline passed while it waited in the queue; it was never run."""

    reason = "queue_timeout"


class DeadlineExceeded(QueueTimeout):
    """A running generation was ended at a step boundary because its deadline had passed
    (one that only looks too slow is cut by degradation instead, and left to finish).

    The same status as a queue timeout (HTTP 503, gRPC ``UNAVAILABLE``: Triton's
    mapping); its own ``reason`` (``deadline_exceeded``) in metrics and events.
    """

    reason = "deadline_exceeded"


class ShuttingDown(Unavailable):
    """The server is stopping and takes no new work."""

    reason = "shutting_down"


class Replaced(ShuttingDown):
    """The model version a request was looked up for was reloaded (another load serves
    in its place) before the request reached its queue; nothing of it was accepted.
    The inference service asks the load serving now instead: a client sees this only
    when the version was reloaded again meanwhile."""


class OutOfMemory(Unavailable):
    """The shared-memory arena has no free block large enough for the tensors."""

    reason = "out_of_memory"


class RateLimited(SordinoError):
    """A rate limit refused the request; retry after ``retry_after_s``."""

    reason = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class StreamBacklogFull(RateLimited):
    """A streaming request's client fell too far behind its responses: ended, cancelled."""

    reason = "stream_backlog"


class Unsupported(SordinoError):
    """A feature was asked for that sordino does not implement (yet)."""

    reason = "unsupported"


class Cancelled(SordinoError):
    """The client cancelled the request before it ran."""

    reason = "cancelled"


class InferenceFailed(SordinoError):
    """The backend raised while running the batch that held this request."""

    reason = "inference_failed"


class ModelError(InferenceFailed):
    """The model raised on a batch: something in the inputs may be at fault.

    The scheduler re-runs a failed batch of several requests one request at a time,
    so that only the request the model cannot take fails (never a whole batch for one
    bad request).
    """


class ModelResponseError(SordinoError):
    """The model answered this request with an error (a Triton Python model's
    ``InferenceResponse(error=TritonError(message, code))``): the request's own answer,
    given as the model wrote it, not a failure of its batch — the batch's other
    requests keep their answers, nothing is run again, and no worker counts it as a
    failure. ``code`` is Triton's error code, which gives the HTTP status and gRPC code
    as Triton gives them (``protocol/status.py``). Made by :func:`model_response_error`.
    """

    reason = "model_response_error"
    code = 1  # TRITONSERVER_ERROR_INTERNAL

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ModelRejected(ModelResponseError):
    """A :class:`ModelResponseError` of the client's kind (Triton's ``UNKNOWN``,
    ``INVALID_ARG``, ``NOT_FOUND``, ``ALREADY_EXISTS``, ``CANCELLED``: a 4xx): counted
    as the client's error, as a request refused for bad input is, not as a failure."""

    reason = "model_rejected"
    code = 3  # TRITONSERVER_ERROR_INVALID_ARG


_SERVER_CODES = frozenset({1, 4, 5})  # INTERNAL, UNAVAILABLE, UNSUPPORTED


def model_response_error(message: str, code: int) -> ModelResponseError:
    """The error a model's error response with Triton's ``code`` is answered with."""
    if code in _SERVER_CODES or code not in range(8):
        return ModelResponseError(message, code if code in _SERVER_CODES else 1)
    return ModelRejected(message, code)
