"""Model files sordino cannot serve, named by what they are and what to use instead.

sordino's model files are ONNX files (and a Python model's ``model.py``, which may load
anything). A file from another stack (an Ascend offline model, a PyTorch checkpoint,
safetensors weights, a TensorRT engine) given as the model would otherwise reach
ONNX Runtime and fail with a protobuf parse error that names neither the file's kind
nor the way out. :func:`foreign_model` recognises them by their extension (the
file's leading bytes are not checked: an Ascend ``.om`` header is not publicly
specified, and no ONNX file is named with these extensions).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["FOREIGN_FORMATS", "foreign_model"]

_EXPORT = "export the source model to ONNX and serve the .onnx file"
_PYTHON = "or load it in a Python model's model.py (backend: python, docs/backends.md)"

FOREIGN_FORMATS: dict[str, str] = {
    ".om": "an Ascend offline model (built by ATC for Huawei's CANN runtime), which only "
    f"CANN can run; {_EXPORT} (e.g. torch.onnx.export of the model ATC was given)",
    ".pt": f"a PyTorch checkpoint; {_EXPORT} (torch.onnx.export), {_PYTHON}",
    ".pth": f"a PyTorch checkpoint; {_EXPORT} (torch.onnx.export), {_PYTHON}",
    ".safetensors": "safetensors weights without a graph; "
    f"{_EXPORT} (e.g. optimum-cli export onnx)",
    ".engine": "a TensorRT engine (built for one GPU and TensorRT version); serve the ONNX "
    "file it was built from",
    ".plan": "a TensorRT engine (built for one GPU and TensorRT version); serve the ONNX "
    "file it was built from",
    ".tflite": f"a TensorFlow Lite model; {_EXPORT} (tf2onnx --tflite)",
}
"""Extension → what such a file is, and what to serve instead."""


def foreign_model(path: Path) -> str | None:
    """What ``path`` is and what to use instead, when it is a model sordino cannot
    serve (by extension, case-insensitive); None otherwise."""
    what = FOREIGN_FORMATS.get(path.suffix.lower())
    return None if what is None else f"{path} is {what}"
