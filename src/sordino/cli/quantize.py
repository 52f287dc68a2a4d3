"""``sordino quantize``: an INT8 or INT4 copy of an ONNX model, with the accuracy guard's hints."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

import click

from sordino.errors import SordinoError

__all__ = ["quantize"]


def _fail(message: str, code: int = 1) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.command(short_help="Quantize an ONNX model to INT8 or INT4 (ONNX Runtime).")
@click.argument("model", type=click.Path(path_type=Path, dir_okay=False, exists=True))
@click.option("--int8", is_flag=True, help="Quantize to INT8 (static or dynamic).")
@click.option(
    "--int4",
    is_flag=True,
    help="Quantize MatMul weights to 4 bits (ONNX Runtime's MatMulNBits; weights only).",
)
@click.option("--block-size", type=int, default=32, show_default=True,
              help="INT4: weight rows per scale (16, 32, 64, 128 or 256).")  # fmt: skip
@click.option(
    "--calibration",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="An .npz of input arrays (one per input, rows first): static quantization; "
    "its last rows are held out as the guard's sample.",
)
@click.option("--dynamic", is_flag=True, help="Dynamic quantization (weights only, no data).")
@click.option(
    "--sample",
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="An .npz of held-out inputs for the accuracy guard (default: from --calibration).",
)
@click.option("--accuracy-bound", type=float, default=0.99, show_default=True,
              help="Least top-1 agreement with the float model the guard accepts.")  # fmt: skip
@click.option("-o", "--output", type=click.Path(path_type=Path, dir_okay=False), required=True)
def quantize(
    model: Path, int8: bool, int4: bool, block_size: int, calibration: Path | None,
    dynamic: bool, sample: Path | None, accuracy_bound: float, output: Path,
) -> None:  # fmt: skip
    """Write an INT8 or INT4 copy of MODEL to OUTPUT; embed its float reference and a sample.

    Serve it with `sordino start --model OUTPUT --quant-aware true` to have the
    runtime compare it with the float model at load and periodically.
    """
    if int8 == int4:
        _fail("give exactly one of --int8 or --int4", 2)
    if not 0 < accuracy_bound <= 1:
        _fail(f"--accuracy-bound {accuracy_bound} must be in (0, 1], e.g. 0.99", 2)
    from sordino.operations.quantize import check_target

    try:
        check_target(model, output)
    except SordinoError as exc:
        _fail(str(exc), 2)
    if int4:
        _int4(model, output, block_size, calibration, dynamic, sample, accuracy_bound)
        return
    if dynamic == (calibration is not None):
        _fail("give exactly one of --calibration data.npz (static) or --dynamic", 2)
    from sordino.operations.quantize import quantize as run_quantize

    try:
        hints, figures = run_quantize(
            model, output, calibration=calibration, sample=sample, accuracy_bound=accuracy_bound
        )
    except SordinoError as exc:
        _fail(str(exc))
    except ModuleNotFoundError:
        raise  # sordino.cli.main names the package to install
    except Exception as exc:  # ONNX Runtime's own errors (an unsupported graph, …)
        _fail(f"ONNX Runtime could not quantize {model}: {exc}")
    kind = "dynamic" if dynamic else "static"
    click.echo(
        f"wrote {output} ({kind} INT8): on {figures.rows} held-out rows top-1 agreement "
        f"{figures.agreement:.1%}, max abs error {figures.max_abs_error:.4g} "
        f"(bound {hints.accuracy_bound:.0%}); float reference {hints.float_reference}"
    )


def _int4(
    model: Path, output: Path, block_size: int, calibration: Path | None, dynamic: bool,
    sample: Path | None, accuracy_bound: float,
) -> None:  # fmt: skip
    if calibration is not None or dynamic:
        _fail(
            "--int4 quantizes weights only: it takes no --calibration or --dynamic; "
            "give --sample data.npz for the guard's held-out inputs",
            2,
        )
    from sordino.operations.quantize import quantize_int4

    try:
        hints, weights, figures = quantize_int4(
            model, output, block_size=block_size, sample=sample, accuracy_bound=accuracy_bound
        )
    except SordinoError as exc:
        _fail(str(exc), 2)
    except ModuleNotFoundError:
        raise  # sordino.cli.main names the package to install
    except Exception as exc:  # ONNX Runtime's own errors (an unsupported graph, …)
        _fail(f"ONNX Runtime could not quantize {model} to INT4: {exc}")
    click.echo(
        f"wrote {output} (INT4 weight-only, {weights} MatMul weight(s), block size "
        f"{block_size}): on {figures.rows} held-out rows top-1 agreement "
        f"{figures.agreement:.1%}, max abs error {figures.max_abs_error:.4g} "
        f"(bound {hints.accuracy_bound:.0%}); float reference {hints.float_reference}"
    )
