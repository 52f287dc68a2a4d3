"""``sordino generate`` against a real ``sordino start --model sd=<a diffusers export>``
(and ``xl=`` an SDXL one, ``sd3=`` an SD3 one, in the same process).

The export's options (negative prompt, size, several images, image to image) reach the
model, several images are written as OUT-1.png, OUT-2.png, SDXL and SD3 exports served
with the same one command draw and redraw an image, and a model that is not a
generator, an unknown model or a size the UNet cannot take are refused in words.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from sordino.cli.main import cli
from tests.cli.conftest import ServerProcess, sordino_start

FIXTURES = Path(__file__).parent.parent / "fixtures" / "sd"
EXPORT = FIXTURES / "tiny-sd"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("generate-export")
    models = ["--model", f"sd={EXPORT}", "--model", f"xl={FIXTURES / 'tiny-sdxl'}"]
    models += ["--model", f"sd3={FIXTURES / 'tiny-sd3'}"]
    with sordino_start(models, folder, timeout=240) as running:
        yield running


def _generate(server: ServerProcess, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["generate", *args, "--url", server.url])
    assert "Traceback" not in result.output
    return result.exit_code, result.output


@pytest.mark.timeout(240)
def test_several_images_of_an_export_are_numbered_files(
    server: ServerProcess, tmp_path: Path
) -> None:
    out = tmp_path / "house.png"
    code, output = _generate(
        server, "a red house", "--model", "sd", "--negative-prompt", "blurry", "--width", "48",
        "--height", "32", "--num-images", "2", "--steps", "3", "--seed", "3", "-o", str(out),
    )  # fmt: skip
    assert code == 0, output
    first, second = tmp_path / "house-1.png", tmp_path / "house-2.png"
    assert not out.exists()
    assert f"wrote {first} .. {second}: 3 steps" in output
    images = [np.asarray(Image.open(path)) for path in (first, second)]
    assert all(image.shape == (32, 48, 3) for image in images)
    assert not np.array_equal(images[0], images[1])  # two draws of the noise
    # The negative prompt reaches the model: another one, another image.
    code, output = _generate(
        server, "a red house", "--model", "sd", "--negative-prompt", "sharp", "--width", "48",
        "--height", "32", "--steps", "3", "--seed", "3", "-o", str(tmp_path / "other.png"),
    )  # fmt: skip
    assert code == 0, output
    assert not np.array_equal(np.asarray(Image.open(tmp_path / "other.png")), images[0])


@pytest.mark.timeout(240)
def test_image_to_image_from_a_file(server: ServerProcess, tmp_path: Path) -> None:
    start = tmp_path / "start.png"
    pixels = (np.arange(32 * 64 * 3) % 251).astype(np.uint8).reshape(32, 64, 3)
    Image.fromarray(pixels).save(start)
    out = tmp_path / "winter.png"
    code, output = _generate(
        server, "the same house in winter", "--model", "sd", "--image", str(start),
        "--strength", "0.5", "--steps", "4", "--seed", "2", "-o", str(out),
    )  # fmt: skip
    assert code == 0, output
    assert "2 steps" in output  # int(4 x 0.5) steps run
    assert Image.open(io.BytesIO(out.read_bytes())).size == (64, 32)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(("model", "steps"), [("xl", 2), ("sd3", 3)])
def test_sdxl_and_sd3_exports_draw_and_redraw_from_the_command_line(
    server: ServerProcess, tmp_path: Path, model: str, steps: int
) -> None:
    out, again = tmp_path / "house.png", tmp_path / "winter.png"
    code, output = _generate(
        server, "a red house", "--model", model, "--width", "48", "--height", "32",
        "--steps", "3", "--seed", "3", "-o", str(out),
    )  # fmt: skip
    assert code == 0, output
    assert Image.open(out).size == (48, 32) and Image.open(out).mode == "RGB"
    # Its own image back, at strength 0.6 of 4 steps: SDXL int(2.4) = 2, SD3 4 - int(1.6) = 3.
    code, output = _generate(
        server, "the same house in winter", "--model", model, "--image", str(out),
        "--strength", "0.6", "--steps", "4", "--seed", "2", "-o", str(again),
    )  # fmt: skip
    assert code == 0, output
    assert f"{steps} steps" in output
    assert Image.open(again).size == (48, 32)


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--model", "sd.text_encoder"], 1, "model 'sd.text_encoder' is not a generator"),
        (["--model", "nothing"], 1, "answered 404"),
        (["--model", "sd", "--width", "40", "--steps", "2"], 1, "multiples of 16"),
        (["--model", "sd", "--strength", "0.5"], 2, "--strength applies to image to image"),
    ],
)
def test_mistakes_are_said_in_words(
    server: ServerProcess, tmp_path: Path, args: list[str], code: int, says: str
) -> None:
    got, output = _generate(server, "a cat", *args, "-o", str(tmp_path / "cat.png"))
    assert got == code, output
    assert says in output
    assert not (tmp_path / "cat.png").exists()


def test_guidance_and_timeout_out_of_range_are_refused_by_the_cli() -> None:
    """``--guidance nan`` was sent as JSON's invalid NaN ("the request body is not valid
    JSON"); ``--timeout -5`` came back as "-5000 microseconds"."""
    for value, option, words in [
        (["--guidance", "nan"], "--guidance", "not a finite number"),
        (["--guidance", "inf"], "--guidance", "not a finite number"),
        (["--guidance", "-1"], "--guidance", "x>=0"),
        (["--timeout", "-5"], "--timeout", "x>=0"),
    ]:
        result = CliRunner().invoke(
            cli, ["generate", "7", *value, "--url", "http://127.0.0.1:9", "-o", "x.png"]
        )
        assert result.exit_code == 2, result.output
        assert option in result.output and words in result.output, result.output
