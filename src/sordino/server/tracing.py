"""Triton's trace extension: timestamps of sampled requests, written to a trace file.

Started with a trace file (``--trace-config triton,file=PATH``, or ``server.trace``),
sordino records, for every ``trace_rate``-th one-shot inference request of a model
(until ``trace_count`` were taken, -1 for no limit), the moments Triton's ``triton``
trace mode records, as Triton 2.51 writes them (JSON, one object per timestamp, on the
monotonic clock in nanoseconds):

- ``HTTP_RECV_START``/``HTTP_RECV_END`` (or ``GRPC_WAITREAD_START``/``_END``): the
  request's headers had come; the server had decoded it;
- ``REQUEST_START``, ``QUEUE_START``: admission began; the request was queued;
- ``COMPUTE_START``, ``COMPUTE_INPUT_END``, ``COMPUTE_OUTPUT_START``, ``COMPUTE_END``:
  its batch began, was staged, came back from the model, was split among its requests;
- ``REQUEST_END``, ``INFER_RESPONSE_COMPLETE``: the request's result was in hand;
- ``HTTP_SEND_START``/``HTTP_SEND_END`` (or ``GRPC_SEND_…``): its answer was encoded and
  handed to the connection.

With ``log_frequency`` N above 0 every N traces go to ``PATH.0``, ``PATH.1``, …; with 0
all of them go to ``PATH`` when the server stops. ``GET``/``POST
/v2[/models/NAME]/trace/setting`` and the gRPC ``TraceSetting`` RPC read and change
``trace_level`` (``["OFF"]`` or ``["TIMESTAMPS"]``), ``trace_rate``, ``trace_count`` and
``log_frequency``, for every model or one (a model's own settings, ``null`` to take the
server's again); values are strings, as Triton's protocol has them. The file and the
mode are set at start only (as on Triton); ``TENSORS`` and the ``opentelemetry`` mode
are refused as not supported.

Not traced: streams, generation and iterative models, cached answers and pipeline
steps (Triton traces steps as child requests); a BLS call is traced as a request of its
own, with no parent. Behind ``--frontends N`` the front-end timestamps are not written
(their processes encode the answers).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route as HttpRoute

from sordino.config.trace import TraceConfig
from sordino.errors import ConfigError, InvalidRequest, Unsupported

if TYPE_CHECKING:
    from sordino.inference import InferRequest, InferResponse
    from sordino.server.route import Route

__all__ = ["FRONTENDS", "Trace", "Tracer", "sent", "stamp_now", "trace_routes", "traced"]

log = logging.getLogger("sordino.tracing")

HELD_AT_MOST = 10_000
"""Traces kept in memory for the stop (``log_frequency`` 0) at most: past it they are
written to the next ``PATH.N`` (a trace is about 1 KB)."""

_SETTINGS = (
    "trace_level", "trace_rate", "trace_count", "log_frequency", "trace_file", "trace_mode",
)  # fmt: skip


FRONTENDS = {"HTTP": ("HTTP_RECV_START", "HTTP_RECV_END"),
             "GRPC": ("GRPC_WAITREAD_START", "GRPC_WAITREAD_END")}  # fmt: skip
"""The transports that stamp a trace's sending (``InferRequest.trace`` says which),
and what their receiving is called."""

T = TypeVar("T")


def stamp_now() -> int:
    """Now on the trace clock (the monotonic clock, nanoseconds: Triton's steady clock)."""
    return time.monotonic_ns()


class _Setting:
    """One set of trace settings (the server's, or a model's own) and its state: the
    requests seen, the traces still to take, those collected and not yet written."""

    __slots__ = ("count", "frequency", "level", "pending", "rate", "seen", "specified")

    def __init__(self, level: tuple[str, ...], rate: int, count: int, frequency: int) -> None:
        self.level, self.rate, self.count, self.frequency = level, rate, count, frequency
        self.seen = 0
        self.pending: list[Trace] = []
        self.specified: set[str] = set()  # a model's: the settings it gives itself

    @property
    def active(self) -> bool:
        return "TIMESTAMPS" in self.level and self.count != 0

    def copy(self) -> _Setting:
        return _Setting(self.level, self.rate, self.count, self.frequency)

    def get(self, name: str) -> Any:
        """The value of the protocol's setting ``name`` (``trace_rate``, ...)."""
        return getattr(self, _ATTRIBUTES[name])

    def set(self, name: str, value: Any) -> None:
        setattr(self, _ATTRIBUTES[name], value)


_ATTRIBUTES = {
    "trace_level": "level",
    "trace_rate": "rate",
    "trace_count": "count",
    "log_frequency": "frequency",
}
"""Each setting the protocol may change, and the :class:`_Setting` attribute holding it."""


class Trace:
    """The timestamps of one sampled request, collected into its setting's file batch."""

    __slots__ = (
        "_setting", "_tracer", "frontend", "id", "model", "request_id", "stamps", "version",
    )  # fmt: skip

    def __init__(
        self, tracer: Tracer, setting: _Setting, ident: int, model: str, version: str, rid: str
    ) -> None:
        self._tracer, self._setting = tracer, setting
        self.id, self.model, self.version, self.request_id = ident, model, version, rid
        self.stamps: list[tuple[str, int]] = []
        self.frontend: str | None = None
        """``HTTP`` or ``GRPC`` while a transport will add its timestamps and collect it."""

    def stamp(self, name: str, ns: int | None = None) -> None:
        self.stamps.append((name, stamp_now() if ns is None else ns))

    def collect(self) -> None:
        """The trace is complete: keep it for the trace file."""
        self._tracer.collected(self, self._setting)

    def records(self) -> list[dict[str, Any]]:
        """Triton's JSON records of this trace: the request, then each timestamp."""
        version: int | str = int(self.version) if self.version.isdigit() else self.version
        head = {"id": self.id, "model_name": self.model, "model_version": version,
                "request_id": self.request_id}  # fmt: skip
        return [head] + [
            {"id": self.id, "timestamps": [{"name": name, "ns": ns}]} for name, ns in self.stamps
        ]


class Tracer:
    """The trace settings of the server and of each model, the sampling, and the file."""

    def __init__(self, config: TraceConfig, has_model: Callable[[str], bool]) -> None:
        """Raises ConfigError for a trace file whose folder does not exist (a trace is
        written when it is taken, long after start: too late to say so)."""
        if config.file is not None and not config.file.parent.is_dir():
            raise ConfigError(
                f"server.trace.file {config.file}: the folder {config.file.parent} does not "
                "exist; create it or give the trace file another path"
            )
        self._file = config.file
        self._has_model = has_model
        self._global = _Setting(
            tuple(config.level), config.rate, config.count, config.log_frequency
        )
        self._models: dict[str, _Setting] = {}
        self._ids = itertools.count(1)
        self._index = 0  # the next PATH.N a batch of traces goes to
        self.on = self._global.active
        """Whether any setting traces (read per request: the rest costs nothing when off)."""

    @classmethod
    def off(cls) -> Tracer:
        """A tracer with no trace file: nothing is traced, and nothing can be."""
        return cls(TraceConfig(), lambda name: False)

    # -- the settings ------------------------------------------------------------------

    def current(self, model: str | None = None) -> dict[str, Any]:
        """The settings as Triton answers them (strings; the level a list)."""
        setting = self._of(model)
        return {
            "trace_level": list(setting.level),
            "trace_rate": str(setting.rate),
            "trace_count": str(setting.count),
            "log_frequency": str(setting.frequency),
            "trace_file": str(self._file) if self._file is not None else "",
            "trace_mode": "triton",
        }

    def update(self, changes: Mapping[str, Any], model: str | None = None) -> dict[str, Any]:
        """Apply ``changes`` (all checked before any is applied) to the server's settings,
        or to ``model``'s own (a ``None`` value: take the server's again); the settings."""
        self._of(model)  # an unknown model is refused first
        parsed = {name: _parsed(name, value) for name, value in changes.items()}
        parsed.pop("trace_mode", None)  # checked: triton, the one there is
        given = parsed.get("trace_level")
        level = given if given is not None else self._of(model).level
        if self._file is None and "TIMESTAMPS" in level:
            raise InvalidRequest(
                "trace file name is not given: start sordino with --trace-config "
                "triton,file=PATH to trace requests"
            )
        if model is None:
            for name, value in parsed.items():
                if value is None:
                    continue  # the server's own settings have nothing to fall back to
                self._global.set(name, value)
                for own in self._models.values():
                    if name not in own.specified:
                        own.set(name, value)
        else:
            own = self._models.get(model) or self._global.copy()
            for name, value in parsed.items():
                if value is None:
                    own.specified.discard(name)
                    own.set(name, self._global.get(name))
                else:
                    own.specified.add(name)
                    own.set(name, value)
            if own.specified:
                self._models[model] = own
            else:
                self._models.pop(model, None)
        self._refresh()
        return self.current(model)

    def _of(self, model: str | None) -> _Setting:
        if model is None:
            return self._global
        if not self._has_model(model):
            raise InvalidRequest(f"unknown model {model!r}: no trace settings for it")
        return self._models.get(model, self._global)

    def _refresh(self) -> None:
        self.on = self._global.active or any(s.active for s in self._models.values())

    # -- the traces --------------------------------------------------------------------

    def sample(self, model: str, version: str, request_id: str | None) -> Trace | None:
        """A trace for this request of ``model`` if it is one to take, else None."""
        setting = self._models.get(model, self._global)
        if not setting.active:
            return None
        setting.seen += 1
        if setting.seen % setting.rate:
            return None
        if setting.count > 0:
            setting.count -= 1
            if setting.count == 0:
                self._refresh()
        return Trace(self, setting, next(self._ids), model, version, request_id or "")

    def collected(self, trace: Trace, setting: _Setting) -> None:
        setting.pending.append(trace)
        if setting.frequency and len(setting.pending) >= setting.frequency:
            self._write(setting.pending, self._numbered())
            setting.pending = []
        elif len(setting.pending) >= HELD_AT_MOST:
            # log_frequency 0 keeps the traces for the stop: never without bound.
            path = self._numbered()
            log.warning(
                "%d traces held for the trace file (log_frequency 0) written to %s; set "
                "log_frequency to write them as they come",
                len(setting.pending),
                path,
            )
            self._write(setting.pending, path)
            setting.pending = []

    def close(self) -> None:
        """Write what is collected and not written (the server stops)."""
        together: list[Trace] = []
        for setting in (self._global, *self._models.values()):
            if setting.pending and setting.frequency:
                self._write(setting.pending, self._numbered())
            else:
                together += setting.pending
            setting.pending = []
        if together and self._file is not None:
            self._write(together, self._file)

    def _numbered(self) -> Path:
        assert self._file is not None
        path = self._file.with_name(f"{self._file.name}.{self._index}")
        self._index += 1
        return path

    def _write(self, traces: list[Trace], path: Path) -> None:
        records = [record for trace in traces for record in trace.records()]
        try:
            path.write_bytes(orjson.dumps(records))
        except OSError as exc:
            log.warning("could not write %d traces to %s: %s", len(traces), path, exc)


async def traced(
    infer_one: Callable[[InferRequest, Route, Trace], Awaitable[InferResponse]],
    request: InferRequest,
    route: Route,
    trace: Trace,
) -> InferResponse:
    """``infer_one`` of a sampled request, stamped from its arrival to its result.

    The trace is collected here unless a transport encodes the answer (it stamps the
    sending, :func:`sent`, and collects it then); a request that fails is collected
    here whoever asked.
    """
    frontend = request.trace if request.trace in FRONTENDS else None
    now = stamp_now()
    if frontend is not None and request.received_at is not None:
        first, last = FRONTENDS[str(frontend)]
        trace.stamp(first, int(request.received_at * 1e9))
        trace.stamp(last, now)
    trace.frontend = None if frontend is None else str(frontend)
    request.trace = trace
    trace.stamp("REQUEST_START", now)
    try:
        response = await infer_one(request, route, trace)
    except BaseException:
        trace.stamp("REQUEST_END")
        trace.collect()
        raise
    trace.stamp("REQUEST_END")
    trace.stamp("INFER_RESPONSE_COMPLETE")
    if frontend is None:
        trace.collect()
    return response


def sent(request: InferRequest, encode: Callable[[], T]) -> T:
    """``encode()`` (a transport's encoding of the answer), stamped as its sending on
    the request's trace, which is then collected."""
    trace = request.trace
    if not isinstance(trace, Trace) or trace.frontend is None:
        return encode()
    start = stamp_now()
    try:
        return encode()
    finally:
        trace.stamp(f"{trace.frontend}_SEND_START", start)
        trace.stamp(f"{trace.frontend}_SEND_END")
        trace.collect()


Handler = Callable[[Request], Awaitable[Response]]


def trace_routes(
    tracer: Tracer, guard: Callable[[Handler], Handler], protect: Callable[[Handler], Handler]
) -> list[HttpRoute]:
    """``GET`` and ``POST /v2[/models/NAME]/trace/setting`` (``guard`` maps errors to
    answers, ``protect`` puts a handler behind the admin check, as Triton restricts
    its ``trace`` endpoints)."""

    async def trace_setting(request: Request) -> Response:
        from sordino.server.http_routes import json_body

        model = request.path_params.get("model")
        if request.method == "GET":
            return JSONResponse(tracer.current(model))
        return JSONResponse(tracer.update(await json_body(request), model))

    handler = guard(protect(trace_setting))
    return [
        HttpRoute(path, handler, methods=["GET", "POST"])
        for path in ("/v2/trace/setting", "/v2/models/{model}/trace/setting")
    ]


def _parsed(name: str, value: Any) -> Any:
    """A setting's value as given (strings, as Triton's protocol sends them; numbers are
    taken too), checked; None stays None (take the server's setting again)."""
    if name not in _SETTINGS:
        raise InvalidRequest(
            f"unknown trace setting {name!r}; the settings are {', '.join(_SETTINGS)}"
        )
    if name == "trace_file":
        raise Unsupported(
            "trace file location can not be updated through network protocol (as on "
            "Triton): give it at start, --trace-config triton,file=PATH"
        )
    if value is None:
        return None
    if name == "trace_mode":
        if value != "triton":
            raise Unsupported(f"trace_mode {value!r} is not supported: sordino traces as triton")
        return None
    if name == "trace_level":
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise InvalidRequest(
                f'trace_level must be a list of levels, ["TIMESTAMPS"] or ["OFF"], not {value!r}'
            )
        return _levels(value)
    text = value if isinstance(value, str) else None
    if isinstance(value, int) and not isinstance(value, bool):
        text = str(value)
    least = {"trace_rate": 1, "trace_count": -1, "log_frequency": 0}[name]
    try:
        number = int(text) if text is not None else None
    except ValueError:
        number = None
    if number is None or number < least or (name == "trace_count" and number == 0):
        meaning = {
            "trace_rate": 'a whole number ≥ 1 (trace every N-th request), as a string: "100"',
            "trace_count": 'the number of traces to take, or -1 for no limit, as a string: "50"',
            "log_frequency": 'a whole number ≥ 0 (traces a file; 0: one file at stop): "0"',
        }[name]
        raise InvalidRequest(f"{name} must be {meaning}; not {value!r}")
    return number


def _levels(value: list[str]) -> tuple[str, ...]:
    known = {"OFF", "TIMESTAMPS", "TENSORS"}
    unknown = [v for v in value if v not in known]
    if unknown:
        raise InvalidRequest(f'unknown trace level {unknown[0]!r}; give ["TIMESTAMPS"] or ["OFF"]')
    if "TENSORS" in value:
        raise Unsupported("trace level TENSORS is not supported: sordino traces TIMESTAMPS")
    return ("TIMESTAMPS",) if "TIMESTAMPS" in value else ("OFF",)
