"""docs/generation.md's examples run against real exports.

The page's models are served from the tiny fixture exports under the names it uses:
``poster`` (SD 1.x, as a repository folder with the page's own ``config.yaml`` beside
the export), ``xl`` (SDXL) and ``sd3`` (SD3), and the built-in ``digits-diffusion``
(all in-process). Every ``curl .../generate`` or ``generate_stream`` body of the page is
sent as written — only ``steps`` lowered to 2 and sizes to 64 px to keep it quick, and
``$(base64 -w0 house.png)`` a small PNG made here — and answers an image; every
``sordino generate`` line runs (the same changes) in one folder, in the page's order (a
later line reads an earlier one's file), and writes what it says. So an input, an
option or a config key the page names cannot drift from what sordino takes.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shlex
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from PIL import Image

from sordino.cli.main import cli
from sordino.config import ModelConfig
from sordino.generation.stable_diffusion import StableDiffusion
from sordino.models.repository import builtin_sources, scan_repository, sources_for
from sordino.testing import RunningServer, serve_in_thread

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "generation.md"
FIXTURES = ROOT / "tests" / "fixtures" / "sd"
BASH = re.compile(r"^```bash\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)
CURL = re.compile(
    r"curl (?:-N )?\S+/v2/models/(?P<model>[\w.-]+)/(?P<path>generate(?:_stream)?)\s+"
    r"-d '(?P<body>.*?)'\s*$"
)
IMAGE = "'\"$(base64 -w0 house.png)\"'"  # the shell splice of a file's base64
SMALL = {"steps": 2, "width": 64, "height": 64}


def _commands() -> list[str]:
    """Each command of the page's bash blocks, continuation lines joined, comments out
    (the digits-diffusion section's too: it is served beside the exports)."""
    commands = []
    text = PAGE.read_text(encoding="utf-8")
    for block in BASH.finditer(text):
        joined = re.sub(r"\\\n\s*", " ", block["body"])
        # A curl body's JSON may go on over lines: up to the closing quote.
        joined = re.sub(r"\n\s+(?=[\"}\w])", " ", joined)
        for line in joined.splitlines():
            line = line.split("  #")[0].strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


COMMANDS = _commands()
CURLS = [c for c in COMMANDS if c.startswith("curl ")]
GENERATES = [c for c in COMMANDS if c.startswith("sordino generate ")]


def test_the_page_has_the_examples_this_test_runs() -> None:
    models = {m["model"] for c in CURLS if (m := CURL.search(c.replace(IMAGE, "")))}
    assert models == {"poster", "xl", "sd3", "digits-diffusion"}
    assert len([c for c in CURLS if CURL.search(c.replace(IMAGE, ""))]) == len(CURLS)
    assert any("--image" in c for c in GENERATES) and any(IMAGE in c for c in CURLS)
    starts = [c for c in COMMANDS if c.startswith("sordino start --model ")]
    assert {c.split()[3].split("=")[0] for c in starts} == {"poster", "xl", "sd3"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """poster from a repository folder with the page's config.yaml; xl and sd3 plain;
    the built-in digits-diffusion the page's last section uses."""
    text = PAGE.read_text(encoding="utf-8")
    config = re.search(r"```yaml\n(# models/poster/config\.yaml\n.*?)```", text, re.DOTALL)
    assert config is not None, "the page's poster config.yaml example"
    repository = tmp_path_factory.mktemp("repo") / "models"
    shutil.copytree(FIXTURES / "tiny-sd", repository / "poster")
    (repository / "poster" / "config.yaml").write_text(config[1], encoding="utf-8")
    sources = [s for s in builtin_sources() if s.name == "digits-diffusion"]
    sources.extend(scan_repository(repository))
    for name, export in (("xl", "tiny-sdxl"), ("sd3", "tiny-sd3")):
        sources.extend(sources_for(ModelConfig(name=name, path=FIXTURES / export)))
    # In-process, to stay light on the 2-core machine (the page's config says nothing
    # of isolation).
    sources = [
        replace(s, config=s.config.model_copy(update={"isolation": "thread"})) for s in sources
    ]
    with serve_in_thread(sources=sources) as running:
        yield running


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the examples' files are: ``house.png`` for the image-to-image curl."""
    path = tmp_path_factory.mktemp("examples")
    Image.new("RGB", (64, 48), (180, 40, 30)).save(path / "house.png")
    return path


@pytest.mark.timeout(300)
def test_the_pages_poster_config_serves_the_export(server: RunningServer) -> None:
    pipeline = server.runtime.registry.get("poster").pipeline
    assert isinstance(pipeline, StableDiffusion)
    assert pipeline.spec.kind == "DPMSolverMultistepScheduler"
    assert pipeline.spec.settings.get("use_karras_sigmas") is True
    with httpx.Client(base_url=server.url, timeout=60) as client:
        parameters = client.get("/v2/models/poster/config").json()["parameters"]
    assert parameters["sordino_steps_default"] == {"string_value": "25"}
    assert parameters["sordino_steps_max"] == {"string_value": "60"}
    assert parameters["sordino_guidance_default"] == {"string_value": "7.5"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("command", CURLS, ids=[f"curl-{i}" for i in range(len(CURLS))])
def test_each_curl_body_answers_an_image(server: RunningServer, folder: Path, command: str) -> None:
    house = base64.b64encode((folder / "house.png").read_bytes()).decode()
    match = CURL.search(command.replace(IMAGE, house))
    assert match is not None, command
    body = json.loads(match["body"])
    body.update({k: v for k, v in SMALL.items() if k in body or k == "steps"})
    if "image" in body:
        body.pop("width", None), body.pop("height", None)  # the image's size
    with httpx.Client(base_url=server.url, timeout=120) as client:
        answer = client.post(f"/v2/models/{match['model']}/{match['path']}", json=body)
    assert answer.status_code == 200, answer.text
    if match["path"] == "generate_stream":
        events = [line for line in answer.text.splitlines() if line.startswith("data:")]
        final = json.loads(events[-1][5:])
    else:
        final = answer.json()
    png = final["png"]
    image = Image.open(io.BytesIO(base64.b64decode(png if isinstance(png, str) else png[0])))
    assert image.mode == ("L" if match["model"] == "digits-diffusion" else "RGB")


@pytest.mark.timeout(300)
def test_each_sordino_generate_line_writes_its_files(
    server: RunningServer, folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(folder)
    for command in GENERATES:
        args = shlex.split(command)[2:]
        for option, value in (("--steps", "2"), ("--width", "64"), ("--height", "64")):
            if option in args:
                args[args.index(option) + 1] = value
        if "--steps" not in args:
            args += ["--steps", "2"]
        result = CliRunner().invoke(cli, ["generate", *args, "--url", server.url])
        assert result.exit_code == 0, f"{command}\n{result.output}"
        output = "-o" if "-o" in args else "--output"
        out = Path(args[args.index(output) + 1])
        count = int(args[args.index("--num-images") + 1]) if "--num-images" in args else 1
        written = [out] if count == 1 else [out.with_name(f"{out.stem}-{i}.png") for i in (1, 2)]
        for path in written:
            assert Image.open(path).mode in ("L" if "--model" not in args else "RGB"), command
