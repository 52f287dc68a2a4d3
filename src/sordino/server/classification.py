"""Triton's classification extension: an output asked for with ``classification: k``.

Instead of the raw output, the response carries, per batch row (or once for a model
that does not batch), the k highest scores as ``BYTES`` strings
``"score:index:label"`` (``"score:index"`` when the model has no labels for that
output), highest first; the output's shape is ``[batch, k]`` (``[k]``). Labels come
from the model config's ``label_filename`` (one label per line) and are read when the
model loads (:func:`read_labels`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from sordino.errors import InvalidRequest, ModelLoadError
from sordino.inference import InferRequest, Tensor
from sordino.memory.refs import Tensors
from sordino.models.repository import ModelSource

__all__ = ["classification_count", "classify", "read_labels", "top_k"]

ALL_OUTPUTS = "*"


def read_labels(source: ModelSource) -> dict[str, list[str]]:
    """Read ``source``'s label files; raise ModelLoadError naming a file that cannot be read."""
    setting = source.config.label_filename
    if setting is None:
        return {}
    files = {ALL_OUTPUTS: setting} if isinstance(setting, Path) else dict(setting)
    folder = source.path if source.path.is_dir() else source.path.parent
    labels: dict[str, list[str]] = {}
    for output, name in files.items():
        path = name if name.is_absolute() else folder / name
        if not path.exists() and not name.is_absolute():
            # In a repository the file sits beside config.yaml, above the version folder.
            path = folder.parent / name
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelLoadError(
                f"model {source.name!r}: label_filename {str(name)!r} cannot be read ({exc}); "
                "give a UTF-8 text file with one label per line, relative to the model's folder"
            ) from None
        labels[output] = text.splitlines()
    return labels


def classification_count(owner: str, parameters: Mapping[str, Any]) -> int | None:
    """The ``classification`` parameter of an output: a positive count, or None when absent."""
    if "classification" not in parameters:
        return None
    count = parameters["classification"]
    if type(count) is not int or count < 1:
        raise InvalidRequest(
            f"{owner}: classification is {count!r}; it must be a positive number of classes"
        )
    if "shared_memory_region" in parameters:
        raise InvalidRequest(
            f"{owner}: a classification output cannot be written into shared memory; "
            "ask for one or the other"
        )
    return count


def top_k(array: Tensor, k: int, labels: list[str] | None, *, batched: bool) -> Tensor:
    """The k best classes of ``array`` as Triton's ``"score:index[:label]"`` strings."""
    rows = array.reshape(array.shape[0], -1) if batched and array.ndim else array.reshape(1, -1)
    k = min(k, rows.shape[1])
    order = np.argsort(-rows.astype(np.float64), axis=1, kind="stable")[:, :k]
    result = np.empty((rows.shape[0], k), dtype=object)
    for r, indices in enumerate(order):
        for c, index in enumerate(indices):
            text = f"{float(rows[r, index]):f}:{int(index)}"
            if labels is not None and index < len(labels):
                text += f":{labels[index]}"
            result[r, c] = text.encode("utf-8")
    return result if batched else result.reshape(k)


def classify(
    request: InferRequest,
    outputs: Tensors,
    datatypes: dict[str, str],
    labels: Mapping[str, list[str]],
    *,
    batched: bool,
) -> tuple[Tensors, dict[str, str]]:
    """Replace each output asked for with ``classification`` by its top k (takes ``outputs``)."""
    classified: dict[str, Tensor] = {}
    for output in request.outputs or ():
        count = classification_count(f"output {output.name!r}", output.parameters)
        if count is None or output.name not in outputs:
            continue
        array = outputs[output.name]
        if array.dtype == np.object_:
            outputs.release()
            raise InvalidRequest(
                f"output {output.name!r} is BYTES; the classification extension takes a "
                "numeric output"
            )
        chosen = labels.get(output.name, labels.get(ALL_OUTPUTS))
        classified[output.name] = top_k(array, count, chosen, batched=batched)
    if not classified:
        return outputs, datatypes
    extra = Tensors.of(classified)
    parts = {name: (extra if name in classified else outputs, name) for name in outputs}
    composed = Tensors.compose(parts)
    outputs.release()
    return composed, {**datatypes, **dict.fromkeys(classified, "BYTES")}
