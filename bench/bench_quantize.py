"""INT8 quantization of the built-in digits classifier: speed, accuracy, the guard's figures.

    python -m bench.bench_quantize [--repeat 2000]

Quantizes ``digits-classifier.onnx`` with ``sordino quantize``'s code (static, calibrated
on the first 1,200 digits; dynamic), then on the held-out digits (the last 597, never
seen by calibration) measures: accuracy against the true labels, top-1 agreement and
max abs error against the float model (what the accuracy guard checks), and ONNX
Runtime latency per batch at batch 1 and 64 (one thread, median of ``--repeat`` runs).
The guard's own check (both models on the embedded 64-row sample) is timed too.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from sklearn.datasets import load_digits

from bench.common import save
from sordino.models.hints import read_hints
from sordino.models.repository import builtin_sources
from sordino.operations.quantize import compare, decode_sample, quantize


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _latency_us(session: ort.InferenceSession, batch: np.ndarray, repeat: int) -> float:
    for _ in range(50):
        session.run(None, {"pixels": batch})
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        session.run(None, {"pixels": batch})
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=2000)
    args = parser.parse_args()
    digits = load_digits()
    x, y = digits.data.astype(np.float32), digits.target
    calibration, held_x, held_y = x[:1200], x[1200:], y[1200:]
    source = next(s.path for s in builtin_sources() if s.name == "digits-classifier")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        data = Path(folder) / "calibration.npz"
        np.savez(data, pixels=calibration)
        models = {"fp32": source}
        for kind in ("static", "dynamic"):
            out = Path(folder) / f"digits_{kind}.onnx"
            quantize(source, out, calibration=data if kind == "static" else None)
            models[f"int8 {kind}"] = out
        float_probs = _session(source).run(None, {"pixels": held_x})[0]
        for label, path in models.items():
            session = _session(path)
            probs = session.run(None, {"pixels": held_x})[0]
            hints = read_hints(path) if label != "fp32" else None
            guard_s = None
            if hints is not None and hints.guard_sample:
                start = time.perf_counter()
                guard = compare(path, source, decode_sample(hints.guard_sample))
                guard_s = time.perf_counter() - start
            rows.append(
                {
                    "model": label,
                    "size_kib": round(path.stat().st_size / 1024, 1),
                    "accuracy": float(np.mean(probs.argmax(1) == held_y)),
                    "agreement": float(np.mean(probs.argmax(1) == float_probs.argmax(1))),
                    "max_abs_error": float(np.max(np.abs(probs - float_probs))),
                    "batch1_us": _latency_us(session, held_x[:1], args.repeat),
                    "batch64_us": _latency_us(session, held_x[:64], args.repeat),
                    "guard_agreement": guard.agreement if guard_s is not None else None,
                    "guard_check_ms": guard_s * 1000 if guard_s is not None else None,
                }
            )
    print(f"{'model':<14}{'KiB':>7}{'accuracy':>10}{'agree':>8}{'max err':>9}"
          f"{'b1 µs':>8}{'b64 µs':>8}{'guard ms':>10}")  # fmt: skip
    for row in rows:
        guard = f"{row['guard_check_ms']:.1f}" if row["guard_check_ms"] is not None else "-"
        print(
            f"{row['model']:<14}{row['size_kib']:>7}{row['accuracy']:>10.2%}"
            f"{row['agreement']:>8.2%}{row['max_abs_error']:>9.4f}"
            f"{row['batch1_us']:>8.1f}{row['batch64_us']:>8.1f}{guard:>10}"
        )
    print("saved", save("quantize", {"rows": rows, "held_out": len(held_y)}))


if __name__ == "__main__":
    main()
