"""Triton's ``reshape``: tensors a client sends and reads in one shape, the model in another.

A ``config.pbtxt`` input or output may give ``reshape { shape: [...] }`` beside its
``dims``: clients (and the model's metadata) see ``dims``, the model takes or gives
``shape``, the same elements in the same order. Triton's own quickstart model
(``densenet_onnx``) returns its ``[1000, 1, 1]`` scores as ``[1000]`` this way; a model
that batches and takes a ``[batch]`` input is declared ``dims: [1] reshape { shape: [] }``.

As Triton does it (its ``infer_request.cc`` and ``infer_response.cc``): with
``max_batch_size`` above 0 the batch dimension stays in front and only what follows is
reshaped; a ``-1`` (any size) of ``dims`` takes its size from the request, and the
``-1``\\ s of the reshape take those sizes in order (and the other way round for an
output). What a configuration may say is checked as Triton checks it, when it is read
(:func:`sordino.config.declared.check_reshape`).

Reshaping only relabels an array's shape: no element is copied.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sordino.errors import ModelLoadError
from sordino.inference import ModelMetadata, TensorSpec

__all__ = ["Reshape", "Reshapes", "reshapes_of"]


def _fill(target: Sequence[int], source_pattern: Sequence[int], source: Sequence[int]) -> list[int]:
    """``target`` with its ``-1``\\ s given the sizes ``source`` has where
    ``source_pattern`` has ``-1``, in order."""
    sizes = iter([s for s, p in zip(source, source_pattern, strict=True) if p == -1])
    return [next(sizes) if dim == -1 else dim for dim in target]


@dataclass(frozen=True, slots=True)
class Reshape:
    """One tensor's reshape: clients see ``dims``, the model ``shape`` (both without the
    batch dimension when the model batches)."""

    name: str
    dims: tuple[int, ...]
    shape: tuple[int, ...]

    def to_model(self, array: Any, batched: bool) -> Any:
        """``array`` (a client's shape) in the model's shape."""
        return self._relabel(array, batched, self.dims, self.shape)

    def to_client(self, array: Any, batched: bool) -> Any:
        """``array`` (the model's shape) in the shape clients see."""
        return self._relabel(array, batched, self.shape, self.dims)

    @staticmethod
    def _relabel(
        array: Any, batched: bool, source: tuple[int, ...], target: tuple[int, ...]
    ) -> Any:
        shape = _shape(tuple(array.shape), batched, source, target)
        return array if shape is None else array.reshape(shape)


def _shape(
    shape: tuple[int, ...], batched: bool, source: tuple[int, ...], target: tuple[int, ...]
) -> tuple[int, ...] | None:
    """``shape`` (after the batch dimension: ``source``'s) as ``target``'s; None when it
    is not ``source``'s rank (left for the checks to name)."""
    lead = shape[:1] if batched else ()
    given = shape[len(lead) :]
    if len(given) != len(source):
        return None
    return lead + tuple(_fill(target, source, given))


@dataclass(frozen=True, slots=True)
class Reshapes:
    """A model's reshaped inputs and outputs. ``batched``: its ``max_batch_size`` is
    above 0, so the batch dimension stays in front (None: as the model batches, for a
    configuration that leaves ``max_batch_size`` to the scheduler)."""

    inputs: tuple[Reshape, ...] = ()
    outputs: tuple[Reshape, ...] = ()
    batched: bool | None = None

    def __bool__(self) -> bool:
        return bool(self.inputs or self.outputs)

    @classmethod
    def of(
        cls,
        inputs: Iterable[tuple[str, Sequence[int], Sequence[int] | None]],
        outputs: Iterable[tuple[str, Sequence[int], Sequence[int] | None]],
        *,
        batched: bool | None,
    ) -> Reshapes:
        """From each input's and output's ``(name, dims, reshape)``, the reshape None for
        a tensor without one."""

        def reshaped(
            tensors: Iterable[tuple[str, Sequence[int], Sequence[int] | None]],
        ) -> tuple[Reshape, ...]:
            return tuple(
                Reshape(name, tuple(dims), tuple(shape))
                for name, dims, shape in tensors
                if shape is not None
            )

        return cls(reshaped(inputs), reshaped(outputs), batched)

    def inputs_to_model(self, batch: dict[str, Any]) -> dict[str, Any]:
        """``batch`` with each reshaped input in the model's shape."""
        if not self.inputs:
            return batch
        batch = dict(batch)
        for reshape in self.inputs:
            if reshape.name in batch:
                batch[reshape.name] = reshape.to_model(batch[reshape.name], bool(self.batched))
        return batch

    def outputs_to_client(self, outputs: dict[str, Any]) -> dict[str, Any]:
        """``outputs`` with each reshaped output in the shape clients see."""
        for reshape in self.outputs:
            if reshape.name in outputs:
                outputs[reshape.name] = reshape.to_client(outputs[reshape.name], bool(self.batched))
        return outputs

    def placer(self, place: Any) -> tuple[Any, dict[str, Any]]:
        """An output placer (``backends/base.py``'s ``OutputPlacer``) for arrays in the
        model's shapes that asks ``place`` for them in the clients' shapes, and the
        arrays it placed (by name; filled once ``place`` was asked): the outputs to
        return as they are, so that the worker finds them where it placed them."""
        placed: dict[str, Any] = {}
        by_name = {reshape.name: reshape for reshape in self.outputs}
        batched = bool(self.batched)

        def model_place(layouts: dict[str, tuple[Any, tuple[int, ...]]]) -> dict[str, Any]:
            asked = {}
            for name, (dtype, shape) in layouts.items():
                reshape = by_name.get(name)
                seen = _shape(shape, batched, reshape.shape, reshape.dims) if reshape else None
                asked[name] = (dtype, shape if seen is None else seen)
            arrays = place(asked)
            placed.update(arrays)
            return {
                name: by_name[name].to_model(array, batched) if name in by_name else array
                for name, array in arrays.items()
            }

        return model_place, placed

    def metadata(self, metadata: ModelMetadata, where: str) -> tuple[ModelMetadata, Reshapes]:
        """``metadata`` (the model's own tensors) as clients see them, and these
        reshapes settled on the model's batching; ModelLoadError when a reshaped
        tensor's shape in the model is not its ``reshape``."""
        if self.batched is None:
            return replace(self, batched=metadata.batched).metadata(metadata, where)
        inputs = self._specs(metadata.inputs, self.inputs, "input", where)
        outputs = self._specs(metadata.outputs, self.outputs, "output", where)
        # A model whose own first dimension is variable but whose configuration does not
        # batch (max_batch_size 0) batches only if its clients' tensors still lead with
        # a variable dimension (the ONNX backend's rule).
        batched = metadata.batched and (
            self.batched or all(spec.shape[:1] == (-1,) for spec in inputs + outputs)
        )
        return replace(metadata, inputs=inputs, outputs=outputs, batched=batched), self

    def _specs(
        self,
        specs: tuple[TensorSpec, ...],
        reshapes: tuple[Reshape, ...],
        kind: str,
        where: str,
    ) -> tuple[TensorSpec, ...]:
        by_name = {reshape.name: reshape for reshape in reshapes}
        out = []
        for spec in specs:
            reshape = by_name.pop(spec.name, None)
            if reshape is None:
                out.append(spec)
                continue
            lead = spec.shape[:1] if self.batched else ()
            own = spec.shape[len(lead) :]
            fits = len(own) == len(reshape.shape) and all(
                a == b or -1 in (a, b) for a, b in zip(own, reshape.shape, strict=True)
            )
            if not fits:
                raise ModelLoadError(
                    f"{where}: {kind} {spec.name} has reshape {list(reshape.shape)}, but the "
                    f"model's shape is {list(own)}"
                    f"{' (after the batch dimension)' if self.batched else ''}"
                )
            out.append(replace(spec, shape=(*lead, *reshape.dims), reshape=reshape.shape))
        if by_name:
            raise ModelLoadError(
                f"{where}: {kind} {', '.join(by_name)} has a reshape but is not one of the "
                "model's; rename or remove it"
            )
        return tuple(out)


def reshapes_of(config: Any) -> Reshapes | None:
    """The reshapes of a :class:`~sordino.config.ModelConfig`'s declared ``input`` and
    ``output`` tensors; None when it has none."""
    limit = config.max_batch_size
    reshapes = Reshapes.of(
        ((t.name, t.dims, t.reshape) for t in config.input),
        ((t.name, t.dims, t.reshape) for t in config.output),
        batched=None if limit is None else limit > 0,
    )
    return reshapes or None
