"""Generate sordino's protobuf message classes from ``kserve_v2.proto``.

Writes ``kserve_v2_pb2.py`` and its type stub ``kserve_v2_pb2.pyi`` next to the
.proto in ``src/sordino/protocol/pb/``. The generated files are committed, so serving
needs only the protobuf runtime, never grpcio-tools. Rerun after editing the .proto::

    source .venv-test/bin/activate           # the README's test environment has grpcio-tools
    python tools/generate_grpc.py            # regenerate
    python tools/generate_grpc.py --check    # exit 1 if the committed files are stale

The command it runs is::

    python -m grpc_tools.protoc -I src --python_out=src --pyi_out=src \\
        src/sordino/protocol/pb/kserve_v2.proto

No ``_pb2_grpc.py`` is generated: the server registers its handlers itself, under the
wire name ``inference.GRPCInferenceService`` (see the note at the top of the .proto).
The protobuf runtime must be at least the version named in the generated file's
``ValidateProtobufRuntimeVersion`` call; pyproject.toml's ``protobuf`` floor matches it.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROTO = Path("sordino/protocol/pb/kserve_v2.proto")
OUTPUTS = ("kserve_v2_pb2.py", "kserve_v2_pb2.pyi")


def generate(out: Path) -> None:
    """Run protoc (from grpcio-tools) on the .proto, writing under ``out``."""
    command = [
        sys.executable,
        "-m",
        "grpc_tools.protoc",
        f"-I{ROOT / 'src'}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        str(ROOT / "src" / PROTO),
    ]
    subprocess.run(command, check=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="compare with the committed files; write nothing"
    )
    args = parser.parse_args(argv)
    committed = ROOT / "src" / PROTO.parent
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp))
        fresh = Path(tmp) / PROTO.parent
        stale = [name for name in OUTPUTS if not _same(fresh / name, committed / name)]
        if args.check:
            for name in stale:
                print(f"{committed / name} is out of date; run tools/generate_grpc.py")
            return 1 if stale else 0
        for name in OUTPUTS:
            shutil.copyfile(fresh / name, committed / name)
            print(f"wrote {committed / name}")
    return 0


def _same(a: Path, b: Path) -> bool:
    return b.exists() and filecmp.cmp(a, b, shallow=False)


if __name__ == "__main__":
    sys.exit(main())
