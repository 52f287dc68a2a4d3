"""Build sordino's built-in demo models.

Writes into ``--out`` (default: ``src/sordino/models/builtin``):

* ``digits-classifier.onnx`` - scikit-learn MLP trained on the 8x8 digits data set;
  raw pixels (0-16) in, 10 class probabilities out.
* ``simple.onnx`` - Triton's canonical "simple" example (INT32 add and subtract).
* ``text-normalizer.onnx`` - lower-cases strings, Unicode included (exercises the BYTES
  datatype).
* ``countdown.onnx`` - one step of a streaming model: COUNT in, REMAINING = COUNT - 1
  (floored at 0) and DONE out; served with ``streaming:`` it streams a countdown.
* ``digits-diffusion.onnx`` - a class-conditional denoiser trained on the same digits:
  sample [B, 64] in [-1, 1], timestep [B, 1] (0-999) and condition [B, 10] (one-hot;
  zeros = unconditional) in, the predicted noise out. Served with ``iterative:``, the
  runtime runs the sampler loop (DDIM or Euler) around it. The script reports the
  training time and the agreement of the built-in classifier with the requested digit.
* ``models.yaml`` - the list of built-ins the runtime serves.

Rerun with::

    python tools/build_builtin_models.py [--out DIR]

Needs numpy, scikit-learn, onnx and onnxruntime (the README's test environment,
``.venv-test``, has them; or ``pip install -e '.[build-models]'`` in an environment that
serves nothing); the graphs are written by hand with ``onnx.helper`` (no skl2onnx). Every
step uses a fixed seed, so reruns with the same library versions produce byte-identical
files. Each model is checked with ONNX Runtime before it is written.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17
IR_VERSION = 8  # onnxruntime >= 1.17 loads IR <= 9; IR 8 is the version that goes with opset 17
PRODUCER = "sordino tools/build_builtin_models.py"
BATCH = "batch"  # symbolic name of the leading (batch) dimension of every input and output
MAX_BATCH_SIZE = 64
SEED = 0

DEFAULT_OUT = Path(__file__).resolve().parents[1] / "src" / "sordino" / "models" / "builtin"


@dataclass(frozen=True)
class Builtin:
    name: str
    description: str
    max_batch_size: int = MAX_BATCH_SIZE
    # A flow mapping written as the model's `streaming:` entry (a step model), or "".
    streaming: str = ""
    # A flow mapping written as the model's `iterative:` entry (a denoiser), or "".
    iterative: str = ""
    # The model's `scheduler_mode:` entry, or "" for the server's mode.
    scheduler_mode: str = ""
    # A flow mapping written as the model's `sequence_batching:` entry, or "".
    sequence_batching: str = ""
    # Class labels, one per line, written to `<name>-labels.txt` as its `label_filename:`.
    labels: tuple[str, ...] = ()

    @property
    def label_file(self) -> str:
        return f"{self.name}-labels.txt" if self.labels else ""

    @property
    def file(self) -> str:
        return f"{self.name}.onnx"


DIGITS = Builtin(
    "digits-classifier",
    "MLP on scikit-learn's 8x8 digits; pixels 0-16 in, 10 class probabilities out",
    labels=("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"),
)
SIMPLE = Builtin(
    "simple",
    'Triton\'s "simple" example - OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32)',
)
TEXT = Builtin(
    "text-normalizer",
    "lower-cases BYTES strings, Unicode included (exercises the BYTES datatype)",
)
COUNTDOWN = Builtin(
    "countdown",
    "streams one response per step - REMAINING counts down from COUNT to 0 (exercises streaming)",
    streaming="{carry: {REMAINING: COUNT}, done: DONE}",
)
DIFFUSION = Builtin(
    "digits-diffusion",
    "class-conditional denoiser on the 8x8 digits; prompt in ('a handwritten 7'), "
    "a 32x32 image and its PNG out (the runtime runs the sampler loop)",
    iterative="{sampler: ddim, steps: {default: 20, max: 50}, guidance: 3.0}",
    # Continuous batching of steps: run whatever steps are queued, never wait to fill a
    # batch. (The adaptive mode's per-batch p99 target would shrink batches under load.)
    scheduler_mode="ultra_low_latency",
)
BUILTINS = (DIGITS, SIMPLE, TEXT, COUNTDOWN, DIFFUSION)

# Triton's example models its client programs expect, served with
# `sordino start --with-triton-examples` (not in the default built-in set).
SIMPLE_STRING = Builtin(
    "simple_string",
    'Triton\'s "simple_string" example - BYTES strings of integers; OUTPUT0 = INPUT0 + INPUT1, '
    "OUTPUT1 = INPUT0 - INPUT1, as strings",
    max_batch_size=8,
)
SIMPLE_INT8 = Builtin(
    "simple_int8",
    'Triton\'s "simple_int8" example - OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT8)',
    max_batch_size=8,
)
REPEAT = Builtin(
    "repeat_int32",
    'Triton\'s decoupled "repeat_int32" example - one response per element of IN (OUT = IN[i], '
    "IDX = i), none for an empty IN; DELAY and WAIT are accepted and not honoured",
    max_batch_size=0,
    streaming="{carry: {NEXT: POS}, done: DONE, emit: EMIT, state: [POS], max_steps: 100000}",
)
SEQUENCE = Builtin(
    "simple_sequence",
    'Triton\'s "simple_sequence" example - an accumulator over a sequence: OUTPUT is the sum of '
    "the sequence's INPUTs so far (START resets it; the state is implicit)",
    max_batch_size=8,
    sequence_batching=(
        "{max_sequence_idle_microseconds: 5000000, direct: {}, control_input: ["
        "{name: START, control: [{kind: CONTROL_SEQUENCE_START, int32_false_true: [0, 1]}]}, "
        "{name: READY, control: [{kind: CONTROL_SEQUENCE_READY, int32_false_true: [0, 1]}]}], "
        "state: [{input_name: STATE_IN, output_name: STATE_OUT}]}"
    ),
)
SIMPLE_IDENTITY = Builtin(
    "simple_identity",
    'Triton\'s "simple_identity" example - OUTPUT0 = INPUT0, a BYTES tensor of any length '
    "(the string clients send it strings with NUL characters and binary blobs)",
    max_batch_size=8,
)
EXAMPLES = (SIMPLE_STRING, SIMPLE_INT8, REPEAT, SEQUENCE, SIMPLE_IDENTITY)
EXAMPLES_OUT = Path(__file__).resolve().parents[1] / "src" / "sordino" / "models" / "examples"


# --------------------------------------------------------------------------------------
# helpers


def _finish(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name=PRODUCER,
        producer_version="1",
        doc_string=doc,
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def _session(model: onnx.ModelProto) -> Any:  # onnxruntime.InferenceSession
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _check(condition: bool, message: str) -> None:
    # Not `assert`: the checks must also run under `python -O`.
    if not condition:
        raise SystemExit(f"check failed: {message}")


# --------------------------------------------------------------------------------------
# digits-classifier


def build_digits() -> tuple[onnx.ModelProto, float]:
    """Train the MLP, export it by hand, check it against scikit-learn; return model, accuracy."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier

    x, y = load_digits(return_X_y=True)  # x: (1797, 64) float64 in 0..16, y: 0..9
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=SEED)
    # The network is trained on pixels scaled to 0..1; the graph does that scaling itself so
    # clients send the raw 0..16 values.
    clf = MLPClassifier(hidden_layer_sizes=(64,), random_state=SEED, max_iter=500)
    clf.fit(x_train / 16.0, y_train)
    accuracy = float(clf.score(x_test / 16.0, y_test))
    print(f"{DIGITS.name}: test accuracy {accuracy:.4f} ({len(y_test)} held-out samples)")
    _check(accuracy >= 0.9, f"digits test accuracy {accuracy:.4f} < 0.9")
    _check(clf.activation == "relu", "expected a ReLU hidden layer")
    _check(clf.out_activation_ == "softmax", "expected a softmax output layer")
    _check(list(clf.classes_) == list(range(10)), "expected classes 0..9 in order")

    (w1, w2), (b1, b2) = clf.coefs_, clf.intercepts_  # w1: (64, 64), w2: (64, 10)
    f32 = np.float32
    initializers = [
        numpy_helper.from_array(np.array([1.0 / 16.0], dtype=f32), "scale"),
        numpy_helper.from_array(w1.astype(f32), "W1"),
        numpy_helper.from_array(b1.astype(f32), "B1"),
        numpy_helper.from_array(w2.astype(f32), "W2"),
        numpy_helper.from_array(b2.astype(f32), "B2"),
    ]
    nodes = [
        helper.make_node("Mul", ["pixels", "scale"], ["scaled"], name="scale"),
        helper.make_node("Gemm", ["scaled", "W1", "B1"], ["hidden_pre"], name="dense1"),
        helper.make_node("Relu", ["hidden_pre"], ["hidden"], name="relu1"),
        helper.make_node("Gemm", ["hidden", "W2", "B2"], ["logits"], name="dense2"),
        helper.make_node("Softmax", ["logits"], ["probabilities"], name="softmax", axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "digits_classifier",
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [BATCH, 64])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [BATCH, 10])],
        initializer=initializers,
    )
    model = _finish(graph, DIGITS.description)

    (got,) = _session(model).run(None, {"pixels": x_test.astype(f32)})
    expected = clf.predict_proba(x_test / 16.0)
    diff = float(np.max(np.abs(got - expected)))
    print(f"{DIGITS.name}: max |onnxruntime - predict_proba| = {diff:.2e}")
    _check(got.shape == (len(x_test), 10), f"unexpected output shape {got.shape}")
    _check(diff <= 1e-5, f"onnxruntime differs from predict_proba by {diff:.2e}")
    return model, accuracy


# --------------------------------------------------------------------------------------
# Triton's examples: simple_string, simple_int8, simple_identity


def build_simple_string() -> onnx.ModelProto:
    def tensor(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.STRING, [BATCH, 16])

    nodes = [
        helper.make_node("Cast", ["INPUT0"], ["a"], to=TensorProto.INT32, name="parse0"),
        helper.make_node("Cast", ["INPUT1"], ["b"], to=TensorProto.INT32, name="parse1"),
        helper.make_node("Add", ["a", "b"], ["sum"], name="add"),
        helper.make_node("Sub", ["a", "b"], ["difference"], name="sub"),
        helper.make_node("Cast", ["sum"], ["OUTPUT0"], to=TensorProto.STRING, name="format0"),
        helper.make_node(
            "Cast", ["difference"], ["OUTPUT1"], to=TensorProto.STRING, name="format1"
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "simple_string",
        [tensor("INPUT0"), tensor("INPUT1")],
        [tensor("OUTPUT0"), tensor("OUTPUT1")],
    )
    model = _finish(graph, SIMPLE_STRING.description)
    a = np.arange(16).reshape(1, 16)
    b = np.full((1, 16), -3)
    out0, out1 = _session(model).run(
        None, {"INPUT0": a.astype(str).astype(object), "INPUT1": b.astype(str).astype(object)}
    )
    _check(out0.ravel().tolist() == [str(v) for v in (a + b).ravel()], "OUTPUT0 != a + b")
    _check(out1.ravel().tolist() == [str(v) for v in (a - b).ravel()], "OUTPUT1 != a - b")
    print(f"{SIMPLE_STRING.name}: ok")
    return model


def build_simple_int8() -> onnx.ModelProto:
    def tensor(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT8, [BATCH, 16])

    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
    ]
    graph = helper.make_graph(
        nodes,
        "simple_int8",
        [tensor("INPUT0"), tensor("INPUT1")],
        [tensor("OUTPUT0"), tensor("OUTPUT1")],
    )
    model = _finish(graph, SIMPLE_INT8.description)
    a = np.arange(16, dtype=np.int8).reshape(1, 16)
    b = np.ones((1, 16), dtype=np.int8)
    out0, out1 = _session(model).run(None, {"INPUT0": a, "INPUT1": b})
    _check(out0.dtype == np.int8 and np.array_equal(out0, a + b), "OUTPUT0 != INPUT0 + INPUT1")
    _check(np.array_equal(out1, a - b), "OUTPUT1 != INPUT0 - INPUT1")
    print(f"{SIMPLE_INT8.name}: ok")
    return model


def build_simple_identity() -> onnx.ModelProto:
    """Triton's simple_identity: BYTES INPUT0 [-1] (batched) returned as OUTPUT0."""

    def tensor(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.STRING, [BATCH, "n"])

    nodes = [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"], name="identity")]
    graph = helper.make_graph(nodes, "simple_identity", [tensor("INPUT0")], [tensor("OUTPUT0")])
    model = _finish(graph, SIMPLE_IDENTITY.description)
    given = np.array([["he\x00llo", "\x00\x01\x02\x03", "é"]], dtype=object)
    (out,) = _session(model).run(None, {"INPUT0": given})
    _check(out.tolist() == given.tolist(), "OUTPUT0 != INPUT0")
    print(f"{SIMPLE_IDENTITY.name}: ok")
    return model


def build_repeat() -> onnx.ModelProto:
    """A step model: step i answers IN[i]; POS (the step's index) is carried as NEXT."""
    i32, u32, i64 = TensorProto.INT32, TensorProto.UINT32, TensorProto.INT64
    inputs = [
        helper.make_tensor_value_info("IN", i32, ["n"]),
        helper.make_tensor_value_info("DELAY", u32, ["n"]),
        helper.make_tensor_value_info("WAIT", u32, [1]),
        helper.make_tensor_value_info("POS", i32, [1]),
    ]
    outputs = [
        helper.make_tensor_value_info("OUT", i32, [1]),
        helper.make_tensor_value_info("IDX", u32, [1]),
        helper.make_tensor_value_info("NEXT", i32, [1]),
        helper.make_tensor_value_info("DONE", TensorProto.BOOL, [1]),
        helper.make_tensor_value_info("EMIT", TensorProto.BOOL, [1]),
    ]
    nodes = [
        helper.make_node("Shape", ["IN"], ["count"]),
        helper.make_node("Cast", ["POS"], ["pos"], to=i64),
        # IN with one more element, so that reading position 0 of an empty IN is defined.
        helper.make_node("Concat", ["IN", "pad"], ["padded"], axis=0),
        helper.make_node("Gather", ["padded", "pos"], ["OUT"], axis=0),
        helper.make_node("Cast", ["POS"], ["IDX"], to=u32),
        helper.make_node("Add", ["POS", "one"], ["NEXT"]),
        helper.make_node("Less", ["pos", "count"], ["EMIT"]),
        helper.make_node("Cast", ["NEXT"], ["next"], to=i64),
        helper.make_node("GreaterOrEqual", ["next", "count"], ["DONE"]),
    ]
    initializers = [
        numpy_helper.from_array(np.zeros(1, dtype=np.int32), "pad"),
        numpy_helper.from_array(np.ones(1, dtype=np.int32), "one"),
    ]
    graph = helper.make_graph(nodes, "repeat_int32", inputs, outputs, initializer=initializers)
    model = _finish(graph, REPEAT.description)
    session = _session(model)
    values = np.array([4, 2, 0, 1], dtype=np.int32)
    feeds = {"IN": values, "DELAY": np.zeros(4, np.uint32), "WAIT": np.zeros(1, np.uint32)}
    for i in range(4):
        out, idx, nxt, done, emit = session.run(None, {**feeds, "POS": np.array([i], np.int32)})
        _check(out.tolist() == [values[i]] and idx.tolist() == [i], f"repeat step {i}")
        _check(bool(emit[0]) and bool(done[0]) == (i == 3) and nxt.tolist() == [i + 1], "flags")
    empty = {"IN": np.zeros(0, np.int32), "DELAY": np.zeros(0, np.uint32)}
    _, _, _, done, emit = session.run(
        None, {**empty, "WAIT": np.zeros(1, np.uint32), "POS": np.zeros(1, np.int32)}
    )
    _check(bool(done[0]) and not bool(emit[0]), "an empty IN sends nothing")
    print(f"{REPEAT.name}: ok")
    return model


def build_sequence() -> onnx.ModelProto:
    """OUTPUT = READY * (INPUT + STATE_IN * (1 - START)); STATE_OUT = OUTPUT."""

    def tensor(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT32, [BATCH, 1])

    nodes = [
        helper.make_node("Sub", ["one", "START"], ["keep"]),
        helper.make_node("Mul", ["STATE_IN", "keep"], ["kept"]),
        helper.make_node("Add", ["INPUT", "kept"], ["total"]),
        helper.make_node("Mul", ["total", "READY"], ["OUTPUT"]),
        helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
    ]
    graph = helper.make_graph(
        nodes,
        "simple_sequence",
        [tensor("INPUT"), tensor("START"), tensor("READY"), tensor("STATE_IN")],
        [tensor("OUTPUT"), tensor("STATE_OUT")],
        initializer=[numpy_helper.from_array(np.ones((1, 1), dtype=np.int32), "one")],
    )
    model = _finish(graph, SEQUENCE.description)
    session = _session(model)
    state = np.zeros((1, 1), np.int32)
    total = 0
    for i, value in enumerate([11, 7, 5]):
        feeds = {
            "INPUT": np.array([[value]], np.int32),
            "START": np.array([[int(i == 0)]], np.int32),
            "READY": np.ones((1, 1), np.int32),
            "STATE_IN": state,
        }
        out, state = session.run(None, feeds)
        total += value
        _check(out.tolist() == [[total]], f"simple_sequence step {i}")
    print(f"{SEQUENCE.name}: ok")
    return model


def write_examples(out: Path) -> None:
    """Write Triton's example models and their manifest into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    models = {
        SIMPLE_STRING.file: build_simple_string(),
        SIMPLE_INT8.file: build_simple_int8(),
        REPEAT.file: build_repeat(),
        SEQUENCE.file: build_sequence(),
        SIMPLE_IDENTITY.file: build_simple_identity(),
    }
    for file, model in models.items():
        path = out / file
        path.write_bytes(model.SerializeToString(deterministic=True))
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    path = out / "models.yaml"
    text = models_yaml(EXAMPLES).replace(
        "# Built-in demo models served by sordino.",
        "# Triton's example models, served by sordino start --with-triton-examples.",
    )
    path.write_text(text, encoding="utf-8")
    print(f"wrote {path}")


# --------------------------------------------------------------------------------------
# simple


def build_simple() -> onnx.ModelProto:
    def tensor(name: str) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, TensorProto.INT32, [BATCH, 16])

    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"], name="add"),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"], name="sub"),
    ]
    graph = helper.make_graph(
        nodes,
        "simple",
        [tensor("INPUT0"), tensor("INPUT1")],
        [tensor("OUTPUT0"), tensor("OUTPUT1")],
    )
    model = _finish(graph, SIMPLE.description)

    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.full((2, 16), 7, dtype=np.int32)
    out0, out1 = _session(model).run(None, {"INPUT0": a, "INPUT1": b})
    _check(out0.dtype == np.int32 and out1.dtype == np.int32, "simple outputs must be INT32")
    _check(np.array_equal(out0, a + b), "OUTPUT0 != INPUT0 + INPUT1")
    _check(np.array_equal(out1, a - b), "OUTPUT1 != INPUT0 - INPUT1")
    print(f"{SIMPLE.name}: ok")
    return model


# --------------------------------------------------------------------------------------
# text-normalizer


def build_text() -> onnx.ModelProto:
    # StringNormalizer only takes [C] or [1, C], so flatten [batch, 1] -> [batch] and back.
    # The locale decides which letters have a lower case. onnxruntime defaults to
    # "en_US.UTF-8" on Linux and refuses to load the model on hosts without it (most
    # containers); "C" exists everywhere but lower-cases ASCII letters only. "C.UTF-8" is
    # the C locale over all of Unicode: built into glibc since 2.35 and shipped by Debian,
    # Ubuntu, Fedora and RHEL 8+ (and musl) long before, so "ÉCOLE" becomes "école".
    initializers = [
        numpy_helper.from_array(np.array([-1], dtype=np.int64), "flat_shape"),
        numpy_helper.from_array(np.array([-1, 1], dtype=np.int64), "column_shape"),
    ]
    nodes = [
        helper.make_node("Reshape", ["text", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node(
            "StringNormalizer",
            ["flat"],
            ["lowered"],
            name="lower",
            case_change_action="LOWER",
            is_case_sensitive=0,
            locale="C.UTF-8",
        ),
        helper.make_node("Reshape", ["lowered", "column_shape"], ["normalized"], name="unflatten"),
    ]
    graph = helper.make_graph(
        nodes,
        "text_normalizer",
        [helper.make_tensor_value_info("text", TensorProto.STRING, [BATCH, 1])],
        [helper.make_tensor_value_info("normalized", TensorProto.STRING, [BATCH, 1])],
        initializer=initializers,
    )
    model = _finish(graph, TEXT.description)

    # onnxruntime's Python binding takes str (not bytes) elements: a bytes object in an object
    # array is passed through str() and arrives as "b'...'". Callers decode BYTES as UTF-8 first.
    sample = np.array(
        [[b"Hello World"], [b"ABC def"], [b"  Keep  Spaces "], ["ÉCOLE ΣΟΦΙΑ".encode()]],
        dtype=object,
    )
    feed = np.vectorize(lambda v: v.decode("utf-8"), otypes=[object])(sample)
    (got,) = _session(model).run(None, {"text": feed})
    expected = [["hello world"], ["abc def"], ["  keep  spaces "], ["école σοφια"]]
    _check(got.shape == (4, 1), f"unexpected output shape {got.shape}")
    _check(got.tolist() == expected, f"text-normalizer returned {got.tolist()!r}")
    print(f"{TEXT.name}: ok")
    return model


# --------------------------------------------------------------------------------------
# countdown


def build_countdown() -> onnx.ModelProto:
    # One step of a streaming model: the runtime feeds REMAINING back in as COUNT until
    # DONE is true for every row (see `streaming:` in models.yaml).
    def tensor(name: str, kind: int) -> onnx.ValueInfoProto:
        return helper.make_tensor_value_info(name, kind, [BATCH, 1])

    initializers = [
        numpy_helper.from_array(np.array(1, dtype=np.int32), "one"),
        numpy_helper.from_array(np.array(0, dtype=np.int32), "zero"),
    ]
    nodes = [
        helper.make_node("Sub", ["COUNT", "one"], ["decremented"], name="decrement"),
        helper.make_node("Max", ["decremented", "zero"], ["REMAINING"], name="floor_at_zero"),
        helper.make_node("LessOrEqual", ["REMAINING", "zero"], ["DONE"], name="done"),
    ]
    graph = helper.make_graph(
        nodes,
        "countdown",
        [tensor("COUNT", TensorProto.INT32)],
        [tensor("REMAINING", TensorProto.INT32), tensor("DONE", TensorProto.BOOL)],
        initializer=initializers,
    )
    model = _finish(graph, COUNTDOWN.description)

    count = np.array([[3], [1], [0]], dtype=np.int32)
    remaining, done = _session(model).run(None, {"COUNT": count})
    _check(remaining.tolist() == [[2], [0], [0]], f"countdown returned {remaining.tolist()!r}")
    _check(done.tolist() == [[False], [True], [True]], f"countdown DONE was {done.tolist()!r}")
    print(f"{COUNTDOWN.name}: ok")
    return model


# --------------------------------------------------------------------------------------
# digits-diffusion

DIFFUSION_T = 1000  # training timesteps (the runtime's sampler uses the same cosine schedule)
DIFFUSION_FREQS = 8  # sinusoidal timestep features: sin and cos at 8 frequencies
DIFFUSION_HIDDEN = (256, 256, 256)
DIFFUSION_EPOCHS = 120
DIFFUSION_REPEATS = 8  # noisy copies of each image per epoch (fresh noise every epoch)
DIFFUSION_DROP_CONDITION = 0.1  # share of rows trained unconditional (classifier-free guidance)


def _timestep_frequencies() -> Any:
    base = np.exp(np.linspace(0.0, np.log(100.0), DIFFUSION_FREQS)) * np.pi / 2
    return (base / DIFFUSION_T).astype(np.float32)


def _diffusion_features(sample: Any, timestep: Any, condition: Any) -> Any:
    angles = timestep.reshape(-1, 1).astype(np.float32) * _timestep_frequencies()[None]
    return np.concatenate([sample, np.sin(angles), np.cos(angles), condition], axis=1)


def build_diffusion() -> onnx.ModelProto:
    """Train the denoiser (scikit-learn MLPRegressor), export it by hand, check it."""
    import time

    from sklearn.datasets import load_digits
    from sklearn.neural_network import MLPRegressor

    from sordino.generation.samplers import Schedule

    schedule = Schedule(train_timesteps=DIFFUSION_T)
    x, y = load_digits(return_X_y=True)
    data = (x / 8.0 - 1.0).astype(np.float32)  # pixels 0..16 -> [-1, 1]
    onehot = np.eye(10, dtype=np.float32)[y]
    rng = np.random.default_rng(SEED)
    net = MLPRegressor(
        hidden_layer_sizes=DIFFUSION_HIDDEN, random_state=SEED, batch_size=256, max_iter=1
    )
    started = time.perf_counter()
    for _ in range(DIFFUSION_EPOCHS):
        x0 = np.repeat(data, DIFFUSION_REPEATS, axis=0)
        condition = np.repeat(onehot, DIFFUSION_REPEATS, axis=0)
        condition[rng.random(len(x0)) < DIFFUSION_DROP_CONDITION] = 0.0
        t = rng.integers(0, DIFFUSION_T, len(x0)).astype(np.float32)
        noise = rng.standard_normal(x0.shape).astype(np.float32)
        ab = schedule.alpha_bar(t)[:, None]
        noisy = (np.sqrt(ab) * x0 + np.sqrt(1.0 - ab) * noise).astype(np.float32)
        net.partial_fit(_diffusion_features(noisy, t, condition), noise)
    seconds = time.perf_counter() - started
    print(f"{DIFFUSION.name}: trained in {seconds:.1f} s, final loss {net.loss_:.4f}")

    f32 = np.float32
    layers = list(zip(net.coefs_, net.intercepts_, strict=True))
    initializers = [numpy_helper.from_array(_timestep_frequencies()[None], "frequencies")]
    nodes = [
        helper.make_node("Mul", ["timestep", "frequencies"], ["angles"], name="angles"),
        helper.make_node("Sin", ["angles"], ["t_sin"], name="sin"),
        helper.make_node("Cos", ["angles"], ["t_cos"], name="cos"),
        helper.make_node(
            "Concat", ["sample", "t_sin", "t_cos", "condition"], ["h0"], name="features", axis=1
        ),
    ]
    for i, (w, b) in enumerate(layers, start=1):
        initializers += [
            numpy_helper.from_array(w.astype(f32), f"W{i}"),
            numpy_helper.from_array(b.astype(f32), f"B{i}"),
        ]
        last = i == len(layers)
        out = "noise" if last else f"pre{i}"
        nodes.append(
            helper.make_node("Gemm", [f"h{i - 1}", f"W{i}", f"B{i}"], [out], name=f"dense{i}")
        )
        if not last:
            nodes.append(helper.make_node("Relu", [out], [f"h{i}"], name=f"relu{i}"))
    graph = helper.make_graph(
        nodes,
        "digits_diffusion",
        [
            helper.make_tensor_value_info("sample", TensorProto.FLOAT, [BATCH, 64]),
            helper.make_tensor_value_info("timestep", TensorProto.FLOAT, [BATCH, 1]),
            helper.make_tensor_value_info("condition", TensorProto.FLOAT, [BATCH, 10]),
        ],
        [helper.make_tensor_value_info("noise", TensorProto.FLOAT, [BATCH, 64])],
        initializer=initializers,
    )
    model = _finish(graph, DIFFUSION.description)

    session = _session(model)
    probe_t = rng.integers(0, DIFFUSION_T, 32).astype(np.float32)
    probe = {
        "sample": rng.standard_normal((32, 64)).astype(f32),
        "timestep": probe_t[:, None],
        "condition": np.eye(10, dtype=f32)[rng.integers(0, 10, 32)],
    }
    (got,) = session.run(None, probe)
    expected = net.predict(_diffusion_features(probe["sample"], probe_t, probe["condition"]))
    diff = float(np.max(np.abs(got - expected)))
    print(f"{DIFFUSION.name}: max |onnxruntime - predict| = {diff:.2e}")
    _check(diff <= 1e-3, f"onnxruntime differs from the regressor by {diff:.2e}")
    return model


def diffusion_agreement(
    denoiser: onnx.ModelProto, classifier: onnx.ModelProto, steps: int, guidance: float = 3.0
) -> float:
    """Share of 200 generated digits (20 per class, DDIM) the classifier labels as asked."""
    from sordino.generation.image import classifier_pixels
    from sordino.generation.samplers import Schedule

    schedule = Schedule(train_timesteps=DIFFUSION_T)
    labels = np.repeat(np.arange(10), 20)
    n = len(labels)
    sample = np.random.default_rng(SEED).standard_normal((n, 64)).astype(np.float32)
    condition = np.concatenate(
        [np.eye(10, dtype=np.float32)[labels], np.zeros((n, 10), np.float32)]
    )
    session = _session(denoiser)
    plan = schedule.plan(steps)
    for i, t in enumerate(plan):
        t_next = plan[i + 1] if i + 1 < len(plan) else -1.0
        both = np.concatenate([sample, sample])
        timestep = np.full((2 * n, 1), t, dtype=np.float32)
        (noise,) = session.run(None, {"sample": both, "timestep": timestep, "condition": condition})
        guided = noise[n:] + guidance * (noise[:n] - noise[n:])
        sample = schedule.step("ddim", sample, guided, np.full(n, t), np.full(n, t_next))
    (probabilities,) = _session(classifier).run(None, {"pixels": classifier_pixels(sample)})
    return float(np.mean(probabilities.argmax(axis=1) == labels))


# --------------------------------------------------------------------------------------
# models.yaml

_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9 ._/'\"()+=,;-]*")


def _yaml_scalar(value: str) -> str:
    """A YAML scalar for `value`: plain when obviously safe, else a JSON (double-quoted) string."""
    if _PLAIN.fullmatch(value) and ": " not in value and " #" not in value:
        return value
    return json.dumps(value, ensure_ascii=False)


def models_yaml(builtins: tuple[Builtin, ...]) -> str:
    lines = [
        "# Built-in demo models served by sordino.",
        "# Generated by tools/build_builtin_models.py - rerun it rather than editing by hand.",
    ]
    for b in builtins:
        lines += [
            f"- name: {_yaml_scalar(b.name)}",
            f"  file: {_yaml_scalar(b.file)}",
            f"  description: {_yaml_scalar(b.description)}",
            f"  max_batch_size: {b.max_batch_size}",
        ]
        if b.streaming:
            lines.append(f"  streaming: {b.streaming}")
        if b.iterative:
            lines.append(f"  iterative: {b.iterative}")
        if b.scheduler_mode:
            lines.append(f"  scheduler_mode: {b.scheduler_mode}")
        if b.sequence_batching:
            lines.append(f"  sequence_batching: {b.sequence_batching}")
        if b.label_file:
            lines.append(f"  label_filename: {_yaml_scalar(b.label_file)}")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help="output directory (default: src/sordino/models/builtin)",
    )
    parser.add_argument(
        "--examples-only",
        action="store_true",
        help="write only Triton's example models (src/sordino/models/examples)",
    )
    args = parser.parse_args(argv)
    write_examples(EXAMPLES_OUT if args.out == DEFAULT_OUT else args.out / "examples")
    if args.examples_only:
        return 0

    models = {
        DIGITS.file: build_digits()[0],
        SIMPLE.file: build_simple(),
        TEXT.file: build_text(),
        COUNTDOWN.file: build_countdown(),
        DIFFUSION.file: build_diffusion(),
    }
    for steps in (50, 20, 10, 4, 2):
        agreement = diffusion_agreement(models[DIFFUSION.file], models[DIGITS.file], steps)
        print(f"{DIFFUSION.name}: agreement at {steps} DDIM steps: {agreement:.3f}")
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    for file, model in models.items():
        path = out / file
        path.write_bytes(model.SerializeToString(deterministic=True))
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    for builtin in BUILTINS:
        if builtin.labels:
            path = out / builtin.label_file
            path.write_text("\n".join(builtin.labels) + "\n", encoding="utf-8")
            print(f"wrote {path}")
    path = out / "models.yaml"
    path.write_text(models_yaml(BUILTINS), encoding="utf-8")
    print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
