"""W3's quality curve on digits-diffusion (``bench_diffusion --quality``): agreement of
the built-in classifier with the asked digit at 50/20/10/4/2 steps, and its chart."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np

from bench.bench_diffusion import FREE, Digits, _classifier, _label, _request, _with_runtime
from bench.common import console
from sordino.server.runtime import Runtime

__all__ = ["chart", "quality"]


async def quality(data_dir: Path, per_digit: int = 20) -> dict[str, dict[int, float]]:
    """Agreement at 50/20/10/4/2 steps through the served generator (no load), with the
    default guidance (3) and without guidance (1)."""

    async def body(runtime: Runtime) -> dict[str, dict[int, float]]:
        classifier = _classifier()
        result: dict[str, dict[int, float]] = {}
        for guidance in (3.0, 1.0):
            curve = result.setdefault(f"guidance {guidance:g}", {})
            for steps in (50, 20, 10, 4, 2):
                hits = total = 0
                for digit in range(10):
                    jobs = []
                    for k in range(per_digit):
                        request = _request(digit, 10_000 + k, FREE, 60.0)
                        request.inputs["steps"] = np.array([steps], dtype=np.int32)
                        request.inputs["guidance"] = np.array([guidance], dtype=np.float32)
                        request.input_datatypes["guidance"] = "FP32"
                        jobs.append(runtime.service.infer(request))
                    for response in await asyncio.gather(*jobs):
                        hits += _label(classifier, np.array(response.outputs["image"])) == digit
                        total += 1
                        response.release()
                curve[steps] = hits / total
                console.print(
                    f"quality: guidance {guidance:g}, {steps} steps -> agreement {curve[steps]:.3f}"
                )
        return result

    answer: dict[str, dict[int, float]] = await _with_runtime(Digits(), "step", data_dir, body)
    return answer


def chart(curves: dict[str, dict[int, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    fig, ax = plt.subplots(figsize=(5, 3.2), dpi=110)
    for label, curve in curves.items():
        steps = sorted(curve)
        ax.plot(steps, [curve[s] for s in steps], marker="o", label=label)
    steps = sorted(next(iter(curves.values())))
    ax.set_xscale("log")
    ax.set_xticks(steps, [str(s) for s in steps])
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_ylim(0, 1.05)
    ax.set_xlabel("denoising steps (DDIM)")
    ax.set_ylabel("agreement")
    ax.set_title("digits-diffusion: quality vs steps")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)
