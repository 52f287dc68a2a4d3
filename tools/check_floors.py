"""Run the test suite with every serving dependency at the floor pyproject.toml gives it.

    python tools/check_floors.py                       # a venv in /tmp/sordino-floors
    python tools/check_floors.py --python python3.13 --venv /tmp/floors313 -- -x tests/cli

pip installs the newest release a range admits, so the suite never sees the oldest
versions ``>=`` promises to work with — the ones a user who adds sordino to an
environment that already has them keeps. This builds a virtual environment with the
test extra, then puts each dependency ``NAME>=X`` back to the newest ``X.*`` release
that has a wheel (``>=1.26`` gives numpy 1.26.x; the floor's own line, not a later
one), with what those need, and runs ``pytest`` there. Where the test extra needs
more than the floor (grpcio, which grpcio-tools pins), the floor is skipped and said so.
About 15 minutes on two cores; not part of ``.ci/run``. Its last run is in
docs/operations.md ("Python and dependency versions").
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {"grpcio": "the test extra's grpcio-tools pins a newer grpcio"}


def _floors(specs: list[str]) -> dict[str, str]:
    found = {}
    for spec in specs:
        requirement, _, marker = spec.partition(";")
        if "win32" in marker and sys.platform == "win32":
            continue
        match = re.match(r"\s*([A-Za-z0-9_.-]+)(\[[^]]*\])?\s*>=\s*([0-9][0-9.]*)", requirement)
        if match is not None:
            found[match.group(1).lower()] = match.group(3)
    return found


def floors() -> list[str]:
    """``NAME==X.*`` for each ``NAME>=X`` of the project's dependencies."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    tests = _floors(project["optional-dependencies"]["test"])
    pins = []
    for name, version in _floors(project["dependencies"]).items():
        if name in SKIP:
            print(f"{name}: floor {version} not checked ({SKIP[name]})")
            continue
        test_floor = tests.get(name)
        if test_floor is not None and test_floor != version:
            print(f"{name}: floor {version} not checked (the test extra asks for {test_floor})")
            version = test_floor
        pins.append(f"{name}=={version}.*")
    return pins


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the venv's interpreter")
    parser.add_argument("--venv", type=Path, default=Path("/tmp/sordino-floors"))
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest")
    args = parser.parse_args()
    pins = floors()
    python = args.venv / "bin" / "python"
    steps = [
        [args.python, "-m", "venv", str(args.venv)],
        [str(python), "-m", "pip", "install", "-q", "-e", f"{ROOT}[test]"],
        # With their dependencies: what a floor needs comes too (ONNX Runtime 1.21's
        # sympy), and what the newest releases left needs older ones (pandas for numpy 1.26).
        [str(python), "-m", "pip", "install", "-q", "--only-binary", ":all:", *pins],
        [str(python), "-m", "pip", "list", "--format", "freeze"],
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.pytest_args],
    ]  # fmt: skip
    for number, step in enumerate(steps, 1):
        shown = " ".join(step if len(step) < 12 else [*step[:9], "…"])
        print(f"[{number}/{len(steps)}] {shown}", flush=True)
        try:
            result = subprocess.run(step, cwd=ROOT, check=False)
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130
        except OSError as exc:
            print(f"error: cannot run {step[0]}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        if result.returncode != 0:
            print(f"step {number} ended with {result.returncode}", file=sys.stderr)
            return result.returncode
    print("the suite passes with every dependency at its floor:", ", ".join(pins))
    return 0


if __name__ == "__main__":
    sys.exit(main())
