"""A Triton Python model's responses joined into a batch's outputs.

``execute`` returns one response per request; :func:`response_parts` checks them and
takes each declared output's tensor from each (a response with an error is that
request's answer: it is set apart, and the outputs hold the other requests' rows; an
output a response lacks, as Triton allows, is left out of its answer, the rows it
would have filled zeros), :func:`set_apart` takes out each output whose tensors are
not the requests' rows of one tensor (each request gets its own, as on Triton),
:func:`output_layouts` says the dtype and shape of each joined output that can be
placed in the arena (numbers and bools),
and :func:`join_outputs` writes each response's tensor into its rows of the array the
worker placed (one copy each), or concatenates them where nothing was placed.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from sordino.backends.python.triton_python_backend_utils import InferenceResponse
from sordino.inference import ModelMetadata, Tensor

__all__ = [
    "PythonModelError",
    "join_outputs",
    "output_layouts",
    "response_parts",
    "set_apart",
    "triton_code",
]


class PythonModelError(RuntimeError):
    """``execute`` failed for a batch: raised, wrong response count, or a response error."""


def response_parts(
    responses: Any,
    expected: int,
    metadata: ModelMetadata,
    rows: Sequence[int],
    parameters: dict[int, str],
    rescheduled: Collection[int] = (),
) -> tuple[dict[str, list[Tensor]], dict[int, tuple[int, str]], dict[int, list[str]]]:
    """Each declared output's tensors, one per response without an error, in request
    order; the errors of the others by request index (Triton's code, the message); and
    the outputs each answered request's response lacks, by request index. Else
    :class:`PythonModelError` saying what is wrong (a count that is not ``expected``,
    a missing response). ``parameters`` gets the parameters (JSON text) of each
    answered response that has some, by request index. The requests ``rescheduled``
    (the model runs them again) must have None in their place and get no rows.

    A response may lack a declared output (Triton answers its request without it: a
    model that returns only ``requested_output_names()`` does). An output no response
    has is left out; one only some lack is filled, for those, with zeros of the rows
    ``rows`` gives them (the requests' row counts; empty for one request) and the
    dtype and other dimensions of the first response that has it, so the joined
    output's rows stay in step with the requests'.
    """
    name = metadata.name
    if not isinstance(responses, list | tuple) or len(responses) != expected:
        got = len(responses) if isinstance(responses, list | tuple) else type(responses)
        raise PythonModelError(
            f"model {name}: execute returned {got} responses for {expected} requests "
            "(it must return one InferenceResponse per request)"
        )
    declared = [spec.name for spec in metadata.outputs]
    parts: dict[str, list[Tensor]] = {output: [] for output in declared}
    errors: dict[int, tuple[int, str]] = {}
    absent: dict[int, list[str]] = {}
    for index, response in enumerate(responses):
        if index in rescheduled:
            if response is not None:
                raise PythonModelError(
                    f"model {name}: Expected a None object in the execute function return "
                    f"list for reschduled request, found type '{type(response)}'."
                )
            continue
        if response is None:
            raise PythonModelError(
                f"model {name}: request {index} got no response (return one from "
                "execute, or send one through its response sender before execute returns)"
            )
        if type(response) is not InferenceResponse and not hasattr(response, "has_error"):
            raise PythonModelError(
                f"model {name}: Expected an 'InferenceResponse' object in the execute "
                f"function return list, found type '{type(response)}'."
            )
        if response.has_error():
            error = response.error()
            errors[index] = (triton_code(error), error.message())
            continue
        # Ours: its own list, read (output_tensors() copies it).
        ours = type(response) is InferenceResponse
        if ours and response._parameters != "{}":
            parameters[index] = response._parameters
        elif not ours and (given := getattr(response, "parameters", lambda: "{}")()) != "{}":
            parameters[index] = given
        tensors = response._outputs if ours else response.output_tensors()
        if len(tensors) == 1 and len(declared) == 1:
            only = tensors[0]
            if only.name() == declared[0]:
                parts[declared[0]].append(only.as_numpy())
                continue
        given = {t.name(): t.as_numpy() for t in tensors}
        missing = [output for output in declared if output not in given]
        if missing:
            absent[index] = missing
        for output in declared:
            parts[output].append(given.get(output, _ABSENT))
    if absent:
        answered = [i for i in range(len(responses)) if i not in errors and i not in rescheduled]
        _fill_absent(parts, absent, answered, rows)
    return parts, errors, absent


_ABSENT: Any = None
"""Where a response lacks an output, until :func:`_fill_absent` fills or drops it."""


def set_apart(
    parts: dict[str, list[Tensor]],
    answered: Sequence[int],
    rows: Sequence[int],
    absent: dict[int, list[str]],
) -> dict[int, dict[str, Tensor]]:
    """Take out of ``parts`` each output whose tensors are not the requests' rows of one
    batch, and return them by request index (Triton answers each request with its
    response's tensors as they are).

    ``parts[name]`` holds a tensor for each request of ``answered`` (their indices, in
    order); ``rows`` the row counts of every request of the batch. An output joins
    when each tensor has the rows of its request, and all have one dtype and the same
    other dimensions; else (another datatype, a variable length, more or fewer rows
    than its request sent) it is set apart. A request whose response lacked the
    output (named in ``absent``) gets none.
    """
    apart: dict[int, dict[str, Tensor]] = {}
    for name, arrays in list(parts.items()):
        if not arrays or _joins(arrays, answered, rows):
            continue
        del parts[name]
        for array, request in zip(arrays, answered, strict=True):
            if name not in absent.get(request, ()):
                apart.setdefault(request, {})[name] = array
    return apart


def _joins(arrays: list[Tensor], answered: Sequence[int], rows: Sequence[int]) -> bool:
    """Whether ``arrays`` are their requests' rows of one tensor (see :func:`set_apart`)."""
    dtype, inner = arrays[0].dtype, arrays[0].shape[1:]
    counts = rows if len(answered) == len(rows) else [rows[request] for request in answered]
    for array, count in zip(arrays, counts, strict=True):
        shape = array.shape
        if not shape or shape[0] != count or shape[1:] != inner:
            return False
        given = array.dtype
        if given is not dtype and given != dtype:
            return False
    return True


def _fill_absent(
    parts: dict[str, list[Tensor]],
    absent: dict[int, list[str]],
    answered: list[int],
    rows: Sequence[int],
) -> None:
    """Drop the outputs no response has; fill the places of those some lack with zeros.

    ``absent`` is left naming only the outputs filled (those dropped are not in any
    answer: nothing to take out of one).
    """
    for output, arrays in list(parts.items()):
        present = next((array for array in arrays if array is not _ABSENT), None)
        if present is None:
            del parts[output]
            continue
        if not any(array is _ABSENT for array in arrays):
            continue
        inner, dtype = present.shape[1:], present.dtype
        for place, request in enumerate(answered):
            if arrays[place] is _ABSENT:
                count = rows[request] if request < len(rows) else 1
                arrays[place] = _zeros((count, *inner), dtype)
    for request, names in list(absent.items()):
        kept = [output for output in names if output in parts]
        if kept:
            absent[request] = kept
        else:
            del absent[request]


def _zeros(shape: tuple[int, ...], dtype: np.dtype[Any]) -> Tensor:
    """Zeros of ``dtype`` (empty strings for an object array: BYTES)."""
    if dtype == np.object_:
        return np.full(shape, b"", dtype=object)
    return np.zeros(shape, dtype)


def triton_code(error: Any) -> int:
    """Triton's error code of ``error`` (ours, or one made by other utilities): one of
    its eight codes, ``INTERNAL`` (1) for anything else."""
    code = error.code()
    code = code if isinstance(code, int) else int(getattr(code, "value", 1))
    return code if code in range(8) else 1


def output_layouts(
    parts: dict[str, list[Tensor]], model: str
) -> dict[str, tuple[np.dtype[Any], tuple[int, ...]]]:
    """The dtype and shape of each output whose dtype can be placed (numbers, bools).

    A request's tensor is that output; several requests' tensors are joined on the
    first axis (their other dimensions must agree, as ``np.concatenate`` needs: else
    :class:`PythonModelError` naming the output) with the dtype ``np.concatenate``
    gives. Strings (``BYTES``) are left out: they are serialized on their way into
    the arena, so there is nothing to place them in.
    """
    layouts: dict[str, tuple[np.dtype[Any], tuple[int, ...]]] = {}
    for name, arrays in parts.items():
        if not arrays:
            continue  # every request was answered with an error
        first = arrays[0]
        if len(arrays) == 1:
            if first.dtype.kind in _PLACEABLE:
                layouts[name] = (first.dtype, tuple(first.shape))
            continue
        inner, dtype = first.shape[1:], first.dtype
        rows, same, placeable = 0, True, True
        for index, array in enumerate(arrays):
            shape = array.shape
            if not shape or shape[1:] != inner:
                raise PythonModelError(
                    f"model {model}: the responses' {name} tensors cannot be joined into "
                    f"a batch: request 0 gave shape {list(first.shape)}, request {index} "
                    f"{list(shape)} (each needs a first, batch dimension and the "
                    "same other dimensions)"
                )
            rows += shape[0]
            if array.dtype != dtype:
                same = False
                placeable = placeable and array.dtype.kind in _PLACEABLE
        if not placeable or dtype.kind not in _PLACEABLE:
            continue
        # One dtype: the join's is that dtype (as np.result_type says for arrays of it).
        joined = dtype if same else np.result_type(*arrays)
        layouts[name] = (joined, (rows, *inner))
    return layouts


_PLACEABLE = frozenset("biufc")
"""The dtype kinds written raw into the arena (bools, integers, floats, complex)."""


def join_outputs(parts: dict[str, list[Tensor]], placed: dict[str, Tensor]) -> dict[str, Tensor]:
    """Each output: its responses' tensors written into ``placed[name]`` where given
    (one copy each, into its rows), else one tensor as it is or several concatenated."""
    outputs: dict[str, Tensor] = {}
    for name, arrays in parts.items():
        if not arrays:
            continue
        target = placed.get(name)
        if target is None:
            outputs[name] = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
            continue
        if len(arrays) == 1:
            target[...] = arrays[0]
        else:
            # One call writes each tensor into its rows (the target's dtype is the join's).
            np.concatenate(arrays, out=target)
        outputs[name] = target
    return outputs
