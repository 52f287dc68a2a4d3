"""The Python backend: a Triton Python-backend ``model.py`` as a sordino backend.

The model folder is Triton's::

    add_sub/
      config.pbtxt        backend: "python", inputs, outputs, max_batch_size, ...
      1/model.py          class TritonPythonModel

:meth:`PythonBackend.load` reads ``config.pbtxt`` (optional when the model's
``auto_complete_config`` gives its inputs and outputs), puts
:mod:`~sordino.backends.python.triton_python_backend_utils` in ``sys.modules`` under
Triton's name, imports ``model.py`` as Triton does (module ``1.model``, with its
version folder on ``sys.path``: ``backends/python/model_dir.py``), calls
``auto_complete_config`` then ``initialize(args)`` with ``args`` as Triton passes them.
The model's inputs and outputs are the configuration's (Triton's rules: with
``max_batch_size`` > 0 every tensor gets a leading batch dimension).

:meth:`PythonBackend.infer_requests` hands ``execute`` one ``InferenceRequest`` per
request of the batch (each a view of its rows, with that request's own facts: see
:func:`_request`), checks that it returns one response per request, and joins the
outputs back into one batch (in a worker process, straight into the arena: each
response's tensor is copied once, into its rows of the output's block). A wrong
count, a response with an error, or an exception raised by ``execute`` fails the
batch with a message saying so (:class:`~sordino.errors.ModelLoadError` never: the
worker keeps serving). A request may also be answered through its response sender
(``backends/python/decoupled.py``).

A decoupled model (``model_transaction_policy { decoupled: true }``) runs through
:meth:`PythonBackend.infer_decoupled` instead: its responses go out as it sends them.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from sordino.backends.base import BackendOptions, BackendStatistics, OutputPlacer
from sordino.backends.calls import ModelCaller
from sordino.backends.decoupled import Responder
from sordino.backends.gpus import check_gpu
from sordino.backends.python import bls
from sordino.backends.python.config_specs import tensor_specs
from sordino.backends.python.decoupled import (
    collect_sent,
    execute_decoupled,
    not_iterative,
    rescheduled,
    sent_responses,
)
from sordino.backends.python.environment import activate, execution_environment
from sordino.backends.python.joining import (
    PythonModelError,
    join_outputs,
    output_layouts,
    response_parts,
    set_apart,
)
from sordino.backends.python.model_dir import forget_model, import_model
from sordino.backends.python.raised import models_own, raised
from sordino.backends.python.readiness import model_readiness
from sordino.backends.python.triton_tensor import private_inputs
from sordino.backends.reshape import Reshapes
from sordino.errors import ModelLoadError
from sordino.inference import (
    REQUEST_ABSENT,
    REQUEST_APART,
    REQUEST_ERRORS,
    REQUEST_PARAMETERS,
    REQUEST_RESCHEDULED,
    ModelMetadata,
    RequestFacts,
    Tensor,
    encode_request_absent,
    encode_request_apart,
    encode_request_errors,
    encode_request_parameters,
    encode_request_rescheduled,
)

__all__ = ["PLATFORM", "PythonBackend", "PythonModelError"]

PLATFORM = "python"
UTILS = "triton_python_backend_utils"


def _utils() -> ModuleType:
    """The utilities module, registered under Triton's name (once per process), and
    importable by it in the processes a model starts (``on_sys_path``), as Triton's
    stub has its backend folder on ``sys.path``."""
    from sordino.backends.python import triton_python_backend_utils as utils

    sys.modules.setdefault(UTILS, utils)
    folder = str(Path(__file__).parent / "on_sys_path")
    if folder not in sys.path:
        sys.path.append(folder)
    return sys.modules[UTILS]


_NO_FACTS = RequestFacts()


def _request(
    utils: ModuleType, model: str, tensors: list[Any], facts: RequestFacts, outputs: Sequence[str]
) -> Any:
    """The ``InferenceRequest`` ``execute`` gets for one request, with its facts.

    As Triton's: ``request_id()`` the request's ``id`` ("" for none),
    ``correlation_id()`` its sequence's ID (an int, or a str for a string ID; 0 for
    none), ``flags()`` its sequence start (1) and end (2) flags, ``timeout()`` its
    ``timeout`` parameter in microseconds (0 for none), ``parameters()`` the
    parameters the server did not consume as a JSON string,
    ``requested_output_names()`` the outputs asked for (every output when the client
    named none; sorted: Triton's is a set). Beside them three attributes for
    sordino's own use (BLS requests made inside ``execute`` carry them on):
    ``_sordino_priority`` (the level, or None), ``_sordino_deadline`` (a
    ``time.time()`` value, or None) and ``_sordino_tenant`` (or None).
    ``tensors`` becomes the request's own list; ``outputs`` (every output, sorted) may
    be shared between requests.
    """
    request = utils.InferenceRequest._for_execute(
        model,
        tensors,
        sorted(facts.outputs) if facts.outputs else outputs,
        facts.id,
        facts.correlation_id,
        facts.flags,
        facts.timeout_us,
        facts.parameters,
    )
    request._sordino_priority = facts.priority
    request._sordino_deadline = facts.deadline
    request._sordino_tenant = facts.tenant
    return request


class PythonBackend:
    """Runs a Triton Python model (``TritonPythonModel``) in this process."""

    def __init__(self, options: BackendOptions) -> None:
        self._options = options
        self._model: Any = None
        self._module: ModuleType | None = None
        self._config: dict[str, Any] = {}
        self._metadata: ModelMetadata | None = None
        self._caller: ModelCaller | None = None
        self._lock = threading.Lock()
        self._batches = self._items = self._failures = 0
        self._busy = 0.0
        self._decoupled = False
        self._reshapes = Reshapes()
        """Tensors clients see in another shape than the model (Triton's ``reshape``)."""
        self._folder = Path()  # the model's folder (config.pbtxt, the version folders)
        self._everything: tuple[str, ...] = ()
        """Every output's name, sorted (the requested outputs of a request naming none)."""

    @property
    def metadata(self) -> ModelMetadata:
        if self._metadata is None:
            raise ModelLoadError(f"model {self._options.name} is not loaded")
        return self._metadata

    @property
    def model_config(self) -> dict[str, Any]:
        """The model's configuration in Triton's JSON form, auto-completed."""
        return self._config

    def load(self, model_path: Path, device: str = "cpu") -> None:
        name, version = self._options.name, self._options.version
        where = f"model {name}"
        version_folder = model_path.parent
        folder = version_folder.parent if version_folder.name.isdigit() else version_folder
        self._folder = folder
        config = self._read_config(folder, where)
        utils = _utils()
        key = f"_sordino_python_model_{name}_{version}"
        module = import_model(key, name, model_path, where)
        model_class = getattr(module, "TritonPythonModel", None)
        if model_class is None:
            raise ModelLoadError(f"{where}: {model_path} defines no class TritonPythonModel")
        if hasattr(model_class, "auto_complete_config"):
            try:
                with bls.executing(bls.Executing(name, phase="auto_complete_config")):
                    completed = model_class.auto_complete_config(utils.ModelConfig(config))
            except BaseException as exc:
                if not models_own(exc):
                    raise
                told = raised(exc, folder)
                raise ModelLoadError(f"{where}: auto_complete_config raised {told}") from exc
            config = completed.as_dict()
        self._decoupled = utils.using_decoupled_model_transaction_policy(config)
        if not config.get("input") and not config.get("output"):
            raise ModelLoadError(
                f"{where}: no inputs or outputs: give them in {folder / 'config.pbtxt'} "
                "or from auto_complete_config"
            )
        batched = int(config.get("max_batch_size", 0)) > 0
        inputs = tensor_specs(config.get("input", ()), batched, where)
        outputs = tensor_specs(config.get("output", ()), batched, where)
        self._config = config
        self._reshapes = Reshapes.of(
            ((s.name, s.item_shape if batched else s.shape, s.reshape) for s in inputs),
            ((s.name, s.item_shape if batched else s.shape, s.reshape) for s in outputs),
            batched=batched,
        )
        batcher = config.get("dynamic_batching")
        gpu = device.startswith("cuda")
        if gpu:
            check_gpu(where, device)
        args = {
            "model_config": json.dumps(config),
            "model_instance_kind": "GPU" if gpu else "CPU",
            "model_instance_name": f"{name}_{self._options.index}",
            "model_instance_device_id": device.split(":", 1)[1] if gpu and ":" in device else "0",
            "model_repository": str(folder),
            "model_version": version,
            "model_name": name,
        }
        model = model_class()
        if hasattr(model, "initialize"):
            try:
                with bls.executing(bls.Executing(name, phase="initialize")):
                    model.initialize(args)
            except BaseException as exc:
                if not models_own(exc):
                    raise
                told = raised(exc, folder)
                raise ModelLoadError(f"{where}: initialize raised {told}") from exc
        self._model, self._module = model, module
        utils.publish_metrics()
        self._everything = tuple(sorted(spec.name for spec in outputs))
        self._metadata = ModelMetadata(
            name=name,
            version=version,
            platform=PLATFORM,
            inputs=inputs,
            outputs=outputs,
            batched=batched,
            # The loader bounds the scheduler's batches by it when sordino's config does
            # not, and joins requests only where the completed config has a dynamic batcher.
            extra={
                "max_batch_size": str(config["max_batch_size"]),
                "dynamic_batching": "on" if "dynamic_batching" in config else "off",
                "max_queue_delay_microseconds": str(
                    int((batcher or {}).get("max_queue_delay_microseconds", 0))
                ),
            }
            if batched
            else {},
            decoupled=self._decoupled,
        )

    def _read_config(self, folder: Path, where: str) -> dict[str, Any]:
        from sordino.backends.pbtxt import read_pbtxt
        from sordino.errors import ConfigError

        path = folder / "config.pbtxt"
        config: dict[str, Any] = {}
        if self._options.triton_config is not None:  # a load's config, instead of the file
            config = json.loads(self._options.triton_config)
            path = Path("the load request's config")
        elif path.is_file():
            try:
                config = read_pbtxt(path)
            except ConfigError as exc:
                raise ModelLoadError(f"{where}: {exc}") from exc
        packages = execution_environment(
            config, folder, f"{where}: {path}", own_process=self._options.own_process
        )
        if packages is not None:  # its own packed environment (Triton's), first on the path
            activate(packages)
        config.setdefault("name", self._options.name)
        config.setdefault("backend", "python")
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        return config

    def infer(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Run ``batch`` as one request (the rows of each request are not known here)."""
        return self.infer_requests(batch, ())

    def infer_requests(
        self,
        batch: dict[str, Tensor],
        rows: Sequence[int],
        facts: Sequence[RequestFacts] = (),
        cancelled: Callable[[int], bool] | None = None,
        place: OutputPlacer | None = None,
    ) -> dict[str, Tensor]:
        """Run ``batch`` as one ``execute`` call with a request per entry of ``rows``.

        ``rows`` are the requests' row counts in order (empty: one request);
        ``facts`` their facts, one each (empty, or a count that does not match: none
        known); ``cancelled(index)`` answers request ``index``'s ``is_cancelled()``.
        Returns each declared output, the responses' tensors joined in request order;
        requests answered with an error (``InferenceResponse(error=...)``) have no rows
        there, and their errors are in :data:`~sordino.inference.REQUEST_ERRORS`. An
        output no response has is left out; one some responses lack has filler rows
        for those, named in :data:`~sordino.inference.REQUEST_ABSENT`; one whose responses'
        tensors are not the requests' rows of one tensor is each request's own, in
        :data:`~sordino.inference.REQUEST_APART`.
        With ``place``, each numeric output is written into the array ``place`` gives
        for it (each response's tensor copied once, into its rows; see
        ``backends/python/joining.py``); what ``place`` raises propagates as it is.
        """
        model = self._model
        if model is None:
            raise ModelLoadError(f"model {self._options.name} is not loaded")
        utils = sys.modules[UTILS]
        metadata = self.metadata
        if self._decoupled:
            raise PythonModelError(
                f"model {metadata.name} is decoupled: its responses are a stream "
                "(infer_decoupled), not one answer per request"
            )
        counts = list(rows) if metadata.batched and len(rows) > 1 else []
        known = list(facts) if len(facts) == max(len(counts), 1) else []
        everything = self._everything
        reshapes = self._reshapes
        placed: dict[str, Tensor] = {}
        if reshapes:
            batch = reshapes.inputs_to_model(batch)
            if place is not None and reshapes.outputs:
                place, placed = reshapes.placer(place)
        inputs = list(private_inputs(batch).items())
        # Arrays that Tensor() would keep as they are (no numpy strings) skip its checks.
        plain = all(type(a) is np.ndarray and a.dtype.kind not in "SU" for _, a in inputs)
        tensor = utils.Tensor._of if plain else utils.Tensor
        requests = []
        start = 0
        for index, count in enumerate(counts or [-1]):
            if count < 0:
                tensors = [tensor(n, a) for n, a in inputs]
            else:
                end = start + count
                tensors = [tensor(n, a[start:end]) for n, a in inputs]
                start = end
            own = known[index] if known else _NO_FACTS
            request = _request(utils, metadata.name, tensors, own, everything)
            if cancelled is not None:
                request._cancelled = functools.partial(cancelled, index)
            requests.append(request)
        sent = collect_sent(requests)
        started = time.perf_counter()
        state = bls.Executing(metadata.name, requests, caller=self._caller)
        try:
            with bls.executing(state):
                responses = model.execute(requests)
            if inspect.iscoroutine(responses):  # async def execute, as Triton runs it
                responses = bls.run_coroutine(responses, state)
            responses = sent_responses(responses, sent)
            given: dict[int, str] = {}
            again = rescheduled(requests)
            parts, errors, absent = response_parts(
                responses, len(requests), metadata, counts, given, again
            )
            apart: dict[int, dict[str, Tensor]] = {}
            if counts:  # outputs that are not the requests' rows go to each as they are
                answered: Sequence[int] = range(len(requests))
                if errors or again:
                    answered = [i for i in answered if i not in errors and i not in again]
                apart = set_apart(parts, answered, counts, absent)
            if again and not self._options.iterative_sequence:
                errors.update(dict.fromkeys(again, not_iterative(metadata.name)))
                again = []
            layouts = output_layouts(parts, metadata.name)
            if place is None:
                outputs = join_outputs(parts, {})
        except BaseException as exc:
            if not models_own(exc):
                raise
            with self._lock:
                self._failures += 1
            if isinstance(exc, PythonModelError):
                raise
            told = raised(exc, self._folder)
            raise PythonModelError(f"model {metadata.name}: execute raised {told}") from exc
        finally:
            utils.publish_metrics()
        if place is not None:
            outputs = join_outputs(parts, place(layouts) if layouts else {})
        if reshapes.outputs:
            reshapes.outputs_to_client(outputs)
            outputs.update((name, placed[name]) for name in placed if name in outputs)
        if errors:
            outputs[REQUEST_ERRORS] = encode_request_errors(len(requests), errors)
        if again:
            outputs[REQUEST_RESCHEDULED] = encode_request_rescheduled(len(requests), again)
        if absent:
            outputs[REQUEST_ABSENT] = encode_request_absent(len(requests), absent)
        if apart:
            order = [spec.name for spec in metadata.outputs]
            outputs[REQUEST_APART] = encode_request_apart(len(requests), apart, order)
        if given:  # the responses' parameters, for their requests' answers
            outputs[REQUEST_PARAMETERS] = encode_request_parameters(len(requests), given)
        elapsed = time.perf_counter() - started
        with self._lock:
            self._batches += 1
            self._items += sum(counts) if counts else 1
            self._busy += elapsed
        return outputs

    def infer_decoupled(
        self,
        batch: dict[str, Tensor],
        rows: Sequence[int],
        responder: Responder,
        facts: Sequence[RequestFacts] = (),
    ) -> None:
        """Run ``batch`` through a decoupled model's ``execute``; responses go to ``responder``.

        Each request has its facts (as :meth:`infer_requests`'s; BLS calls made for it
        carry its priority, deadline and tenant). Returns once ``execute`` returned
        (the model's threads may still be sending); raises :class:`PythonModelError`
        when it raised or returned other than None.
        """
        model = self._model
        if model is None:
            raise ModelLoadError(f"model {self._options.name} is not loaded")
        metadata = self.metadata
        utils = sys.modules[UTILS]
        count = len(rows) if metadata.batched and len(rows) > 1 else 1
        known = list(facts) if len(facts) == count else []
        everything = self._everything

        def request_for(index: int, tensors: list[Any]) -> Any:
            own = known[index] if known else _NO_FACTS
            return _request(utils, metadata.name, tensors, own, everything)

        started = time.perf_counter()
        try:
            declared = {spec.name: spec.datatype for spec in metadata.outputs}
            execute_decoupled(
                model,
                metadata.name,
                batch,
                rows,
                metadata.batched,
                responder,
                declared,
                request_for=request_for,
                caller=self._caller,
                reshapes=self._reshapes,
                iterative=self._options.iterative_sequence,
            )
        except BaseException as exc:
            if not models_own(exc):
                raise
            with self._lock:
                self._failures += 1
            told = raised(exc, self._folder)
            raise PythonModelError(f"model {metadata.name}: execute raised {told}") from exc
        finally:
            _utils().publish_metrics()
        with self._lock:
            self._batches += 1
            self._items += sum(rows) if len(rows) > 1 else 1
            self._busy += time.perf_counter() - started

    def unload(self) -> None:
        model, self._model = self._model, None
        if model is not None and hasattr(model, "finalize"):
            with bls.executing(bls.Executing(self._options.name, phase="finalize")):
                try:
                    model.finalize()
                except BaseException as exc:
                    if isinstance(exc, Exception) or not models_own(exc):
                        raise
                    raise PythonModelError(f"finalize raised {raised(exc, self._folder)}") from exc
        module, self._module = self._module, None
        forget_model(module)

    @property
    def checks_readiness(self) -> bool:
        return hasattr(self._model, "is_ready")  # (see readiness.py)

    def readiness(self) -> str | None:
        return model_readiness(self._model, self._options.name)

    def set_caller(self, caller: ModelCaller | None) -> None:
        """Carry the model's BLS calls with ``caller`` (one per process: the worker's pipe,
        or the server's loop for a thread instance)."""
        self._caller = caller
        bls.install(caller)

    def statistics(self) -> BackendStatistics:
        with self._lock:
            return BackendStatistics(self._batches, self._items, self._failures, self._busy)
