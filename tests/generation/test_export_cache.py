"""The cache of rewritten Stable Diffusion graphs: by default a folder of the temporary
folder's (every user's), made private and refused when someone else could write in it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from sordino.errors import ModelLoadError
from sordino.models.diffusers_export import _cache_path


@pytest.fixture
def scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "tmp"
    where.mkdir(mode=0o777)
    monkeypatch.setattr(tempfile, "tempdir", str(where))
    monkeypatch.delenv("SORDINO_CACHE_DIR", raising=False)
    return where


def _source(tmp_path: Path) -> Path:
    source = tmp_path / "unet.onnx"
    source.write_bytes(b"graph")
    return source


def test_the_default_cache_is_made_private_to_this_user(tmp_path: Path, scratch: Path) -> None:
    path = _cache_path(_source(tmp_path), "unet", "v3")
    cache = scratch / f"sordino-cache-{os.getuid()}"
    assert path.is_relative_to(cache)
    assert cache.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("planted", ["writable", "another's", "a file"])
def test_a_cache_folder_someone_else_could_have_filled_is_refused(
    tmp_path: Path, scratch: Path, planted: str
) -> None:
    cache = scratch / f"sordino-cache-{os.getuid()}"
    if planted == "a file":
        cache.write_text("")
    else:
        cache.mkdir(mode=0o700)
        cache.chmod(0o777 if planted == "writable" else 0o755)
    if planted == "another's":
        if os.getuid() != 0:
            pytest.skip("only root can give a folder to another user")
        os.chown(cache, 65534, 65534)
    with pytest.raises(ModelLoadError, match="set SORDINO_CACHE_DIR to a folder of yours"):
        _cache_path(_source(tmp_path), "unet", "v3")


def test_a_cache_folder_given_is_used_as_it_is(
    tmp_path: Path, scratch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SORDINO_CACHE_DIR", str(tmp_path / "mine"))
    assert _cache_path(_source(tmp_path), "unet", "v3").is_relative_to(tmp_path / "mine")
