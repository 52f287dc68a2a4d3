"""With no version asked for, the registry serves the highest loaded one as versions come and go."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from sordino.errors import NotFound
from sordino.inference import ModelKey
from sordino.models.repository import builtin_sources
from sordino.server.registry import LoadedModel, ModelRegistry
from sordino.testing import serve_in_thread


@pytest.fixture(scope="module")
def loaded() -> Iterator[LoadedModel]:
    simple = [s for s in builtin_sources() if s.name == "simple"]
    with serve_in_thread(sources=simple) as running:
        yield running.runtime.get("simple")


def _version(model: LoadedModel, version: str) -> LoadedModel:
    return dataclasses.replace(model, key=ModelKey("simple", version))


def test_newest_version_follows_adds_and_removes(loaded: LoadedModel) -> None:
    registry = ModelRegistry()
    for version in ("2", "10", "1"):
        registry.add(_version(loaded, version))
    assert registry.get("simple").key.version == "10"  # numerically highest, not "2"
    assert registry.get("simple", "2").key.version == "2"
    registry.remove("simple", "10")
    assert registry.get("simple").key.version == "2"
    registry.add(_version(loaded, "3"))
    assert registry.get("simple", "").key.version == "3"
    registry.remove("simple", "3")
    registry.remove("simple", "2")
    registry.remove("simple", "1")
    with pytest.raises(NotFound, match="unknown model"):
        registry.get("simple")


def test_a_replaced_version_is_the_one_served(loaded: LoadedModel) -> None:
    registry = ModelRegistry()
    first = _version(loaded, "1")
    registry.add(first)
    second = dataclasses.replace(first, instances=2)  # the same version loaded again
    registry.add(second)
    assert registry.get("simple") is second
