"""Every YAML example in the documentation is a configuration sordino accepts.

Each fenced ```` ```yaml ```` block of ``docs/*.md`` and ``README.md`` is read with the
real loader, so an example cannot drift from the schema. What a block is, is said by
its first line, which the reader sees too:

- ``# under KEY.PATH`` (dotted mapping keys, e.g. ``# under scheduler.strategies``):
  a fragment. It is nested under those keys and loaded as a whole configuration
  file with :func:`sordino.config.load_config` — so a fallback chain fragment must
  declare the devices it names, as a real file must.
- ``# DIR/MODEL/config.yaml``: a model repository's per-model ``config.yaml``, loaded
  with :func:`sordino.config.load_model_config_file`.
- anything else: a whole configuration file, loaded with
  :func:`sordino.config.load_config`.

Only the configuration is checked by that rule, not that the files it names exist:
examples point at the reader's models. The configuration page's complete example is
also started for real, with the repository its page describes.
"""

from __future__ import annotations

import re
import shutil
import textwrap
from importlib import resources
from pathlib import Path

import httpx
import pytest

from sordino.config import load_config, load_model_config_file
from sordino.errors import ConfigError
from tests.cli.conftest import sordino_start

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
# A fence may be indented (inside a list item); its body is dedented.
FENCE = re.compile(
    r"^(?P<indent>[ \t]*)```ya?ml[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
    re.MULTILINE | re.DOTALL,
)
UNDER = re.compile(r"#\s*under\s+(?P<keys>[a-z_]+(?:\.[a-z_]+)*)\s*:?\s*$")
MODEL_CONFIG = re.compile(r"#\s*\S+/[^/\s]+/config\.yaml\s*$")


def yaml_blocks() -> list[tuple[str, str]]:
    """Every fenced yaml block as (``file:line``, text)."""
    blocks = []
    for page in DOCS:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            blocks.append((f"{page.relative_to(ROOT)}:{line}", textwrap.dedent(match["body"])))
    return blocks


def load_block(text: str, tmp_path: Path) -> object:
    """Load one documentation block the way its first line says (see the module docstring)."""
    first = text.splitlines()[0].strip() if text.strip() else ""
    if MODEL_CONFIG.fullmatch(first):
        path = tmp_path / "config.yaml"
        path.write_text(text, encoding="utf-8")
        return load_model_config_file(path)
    under = UNDER.fullmatch(first)
    if under is not None:
        for key in reversed(under["keys"].split(".")):
            text = f"{key}:\n" + textwrap.indent(text, "  ")
    path = tmp_path / "sordino.yaml"
    path.write_text(text, encoding="utf-8")
    return load_config(path)


BLOCKS = yaml_blocks()


def test_the_docs_have_yaml_examples() -> None:
    """The pattern finds the blocks (a changed fence style would otherwise pass silently)."""
    assert len(BLOCKS) >= 8
    assert any(where.startswith("docs/configuration.md") for where, _ in BLOCKS)


@pytest.mark.parametrize(("where", "text"), BLOCKS, ids=[where for where, _ in BLOCKS])
def test_yaml_block_is_a_valid_configuration(where: str, text: str, tmp_path: Path) -> None:
    """The block loads with the real loader (a fragment as the section it belongs to)."""
    load_block(text, tmp_path)


def test_a_fragment_is_nested_under_its_keys(tmp_path: Path) -> None:
    """``# under a.b`` puts the block at ``a.b`` of a whole file."""
    config = load_block("# under scheduler\nslo_p99_ms: 42\n", tmp_path)
    assert config.scheduler.slo_p99_ms == 42  # type: ignore[attr-defined]


def test_an_unmarked_fragment_fails(tmp_path: Path) -> None:
    """A fragment without its ``# under`` line is read as a whole file and refused."""
    with pytest.raises(ConfigError, match="unknown key 'slo_p99_ms'"):
        load_block("slo_p99_ms: 42\n", tmp_path)


def _block(page: str, heading: str) -> str:
    """The first yaml block after ``heading`` on ``docs/page``."""
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    match = FENCE.search(text, text.index(heading))
    assert match is not None
    return match["body"]


def test_the_complete_example_starts_on_this_machine(tmp_path: Path) -> None:
    """docs/configuration.md's complete example serves both its models, here too.

    Its model prefers CUDA: without it (as on a CPU-only machine), one log line says so
    and the model runs on the next provider. The repository is the page's own layout
    and Triton example, with the built-in digits model in every model file.
    """
    digits = Path(str(resources.files("sordino.models.builtin").joinpath("digits-classifier.onnx")))
    (tmp_path / "models").mkdir()
    shutil.copy(digits, tmp_path / "models" / "digits.onnx")
    resnet = tmp_path / "model_repository" / "resnet50"
    for version in ("1", "2"):
        (resnet / version).mkdir(parents=True)
        shutil.copy(digits, resnet / version / "model.onnx")
    (resnet / "config.yaml").write_text(
        _block("configuration.md", "## Coming from Triton"), encoding="utf-8"
    )
    config = tmp_path / "sordino.yaml"
    config.write_text(_block("configuration.md", "## A complete example"), encoding="utf-8")

    with sordino_start(["--config", str(config), "--host", "127.0.0.1"], tmp_path) as server:
        pixels = {"name": "pixels", "shape": [1, 64], "datatype": "FP32", "data": [2.0] * 64}
        for model in ("digits", "resnet50"):
            r = httpx.post(f"{server.url}/v2/models/{model}/infer", json={"inputs": [pixels]})
            assert r.status_code == 200, r.text
    loaded = sorted(line.split(":")[0] for line in server.lines if line.startswith("loaded "))
    assert loaded == ["loaded digits v1", "loaded resnet50 v1"]
    fallbacks = [line for line in server.lines if "falling back to" in line]
    if "CUDAExecutionProvider" in ort_providers():
        assert fallbacks == []
    else:
        (line,) = fallbacks
        assert "model digits: CUDAExecutionProvider is not in this onnxruntime build" in line


def ort_providers() -> list[str]:
    import onnxruntime as ort

    return list(ort.get_available_providers())
