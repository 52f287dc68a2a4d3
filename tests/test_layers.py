"""The import rules of docs/architecture.md, checked over every module of ``src/sordino``.

Each top-level part of the package may import the foundation (errors, clock, events,
datatypes, inference, records, config, lazy, memo and the package root) and the parts listed for
it in :data:`ALLOWED`, never a part above it. Imports inside functions and under
``TYPE_CHECKING`` count too: a lazy import is still a dependency. No module is over 500
lines (generated protobuf code aside).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import sordino

SRC = Path(sordino.__file__).parent

FOUNDATION = frozenset(
    {
        "__init__",
        "errors",
        "clock",
        "events",
        "datatypes",
        "inference",
        "records",
        "config",
        "lazy",
        "memo",
    }
)

# The request path's parts: what the server is built from.
_SERVING = frozenset(
    {
        "protocol",
        "admission",
        "scheduling",
        "execution",
        "memory",
        "backends",
        "models",
        "control",
        "telemetry",
        "generation",
        "guardian",
        "operations",
    }
)

# Which parts (besides the foundation and itself) each part may import. Keep in step
# with the table in docs/architecture.md.
ALLOWED: dict[str, frozenset[str]] = {
    # protocol imports only the foundation: telemetry classes refusals by its status map
    "telemetry": frozenset({"protocol"}),
    "protocol": frozenset(),
    "models": frozenset({"backends"}),
    "backends": frozenset(),
    "memory": frozenset({"telemetry"}),
    "admission": frozenset({"telemetry"}),
    "execution": frozenset({"backends", "memory", "telemetry"}),
    "scheduling": frozenset({"execution", "memory", "telemetry"}),
    "generation": frozenset({"scheduling", "memory", "telemetry"}),
    "reports": frozenset({"telemetry"}),
    "loadtest": frozenset({"protocol", "telemetry", "reports"}),
    "guardian": frozenset({"telemetry", "admission", "execution", "memory", "backends"}),
    "control": frozenset(
        {"execution", "scheduling", "memory", "backends", "telemetry", "protocol", "models"}
    ),
    "operations": frozenset({"telemetry", "models", "backends"}),
    "server": _SERVING,
    "cli": _SERVING | {"server", "reports", "loadtest"},
    "__main__": frozenset({"cli"}),
    "testing": _SERVING | {"server"},
}


def _part(module: str) -> str:
    """``sordino.execution.chain`` -> ``execution``; ``sordino`` -> ``__init__``."""
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def _modules() -> list[Path]:
    return sorted(p for p in SRC.rglob("*.py") if "pb" not in p.relative_to(SRC).parts)


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("sordino")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "sordino":
                # ``from sordino import x``: x may be a part (a subpackage) or a name.
                found += [
                    (node.lineno, f"sordino.{a.name}")
                    if (SRC / a.name).is_dir() or (SRC / f"{a.name}.py").is_file()
                    else (node.lineno, "sordino")
                    for a in node.names
                ]
            elif node.module.startswith("sordino."):
                found.append((node.lineno, node.module))
    return found


def _violations() -> list[str]:
    problems = []
    for path in _modules():
        relative = path.relative_to(SRC)
        part = relative.parts[0].removesuffix(".py")
        allowed = FOUNDATION if part in FOUNDATION else FOUNDATION | ALLOWED[part] | {part}
        for line, module in _imports(path):
            target = _part(module)
            if target not in allowed:
                problems.append(f"sordino/{relative}:{line} ({part}) imports {module}")
    return problems


def test_every_part_has_a_rule() -> None:
    """A new top-level part must be placed in the layer table before it can land."""
    parts = {
        p.stem
        for p in SRC.iterdir()
        if p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file())
    }
    unknown = sorted(p for p in parts if p not in FOUNDATION and p not in ALLOWED)
    assert unknown == [], f"add {unknown} to ALLOWED (and to docs/architecture.md)"


def test_imports_follow_the_layers() -> None:
    """No module imports a part above its own (telemetry never imports scheduling, ...)."""
    problems = _violations()
    assert problems == [], "layer violations:\n" + "\n".join(problems)


@pytest.mark.parametrize("line", ["from sordino.scheduling.scheduler import X"])
def test_the_checker_sees_a_violation(tmp_path: Path, line: str) -> None:
    """The checker itself flags an upward import (so the rule test cannot pass vacuously)."""
    probe = tmp_path / "probe.py"
    probe.write_text(f"def f():\n    {line}\n")
    assert _imports(probe) == [(2, "sordino.scheduling.scheduler")]
    assert _part("sordino.scheduling.scheduler") not in FOUNDATION | ALLOWED["telemetry"]


MAX_LINES = 500


def test_no_module_is_over_500_lines() -> None:
    """A module past 500 lines holds more than one job (issue 30): split it by job."""
    long = sorted(
        f"sordino/{path.relative_to(SRC)}: {count} lines"
        for path in _modules()
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    )
    assert long == [], "split these modules:\n" + "\n".join(long)
