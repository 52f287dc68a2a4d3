"""Documents past the limits (alias bombs, deep nesting, absurd dotted keys) get a clear refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from sordino.config import load_config, validate_config
from sordino.config.bounded import MAX_NODES, check_nesting, dotted_parts, load_yaml
from sordino.errors import ConfigError


def alias_bomb(levels: int = 9) -> str:
    """A few hundred bytes of YAML whose aliases expand to 9**levels strings."""
    words = ", ".join(['"lol"'] * 9)
    lines = ["scheduler:", "  strategies:", f"    - &l0 [{words}]"]
    for level in range(1, levels):
        refs = ", ".join([f"*l{level - 1}"] * 9)
        lines.append(f"    - &l{level} [{refs}]")
    return "\n".join(lines) + "\n"


def test_a_config_file_alias_bomb_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb(), encoding="utf-8")
    with pytest.raises(ConfigError, match=f"expands to more than {MAX_NODES} values"):
        load_config(path)


def test_ordinary_aliases_still_load() -> None:
    text = "a: &shared {x: 1, y: [1, 2]}\nb: *shared\nc: *shared\n"
    document, _ = load_yaml(text, "t.yaml")
    assert document["c"] == {"x": 1, "y": [1, 2]}


def test_a_self_referring_alias_is_refused() -> None:
    with pytest.raises(ConfigError, match="refers to itself"):
        load_yaml("a: &a [1, *a]\n", "t.yaml")


def test_an_oversized_yaml_text_is_refused() -> None:
    with pytest.raises(ConfigError, match="at most 1048576 bytes"):
        load_yaml("x: " + "a" * (1 << 20) + "\n", "big.yaml")


def test_deep_yaml_nesting_is_refused() -> None:
    with pytest.raises(ConfigError, match="nested more than 32 levels"):
        load_yaml("[" * 200 + "]" * 200, "deep.yaml")


@pytest.mark.parametrize(
    ("key", "needle"),
    [
        ("scheduler." + "a." * 5000 + "b", "too long"),
        ("." * 10_000, "too long"),
        ("a.b.c.d.e.f.g.h.i.j.k.l.m.n.o.p.q", "at most 16"),
        ("server..http_port", "empty part"),
    ],
    ids=["long", "dots", "parts", "empty"],
)
def test_malformed_override_keys_are_refused(key: str, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle) as caught:
        load_config(None, {key: 1})
    assert len(str(caught.value)) < 400  # the key is not echoed whole


def test_a_deeply_nested_mapping_is_refused_without_recursion() -> None:
    deep: dict[str, object] = {}
    inner = deep
    for _ in range(5000):
        inner["a"] = {}
        inner = inner["a"]  # type: ignore[assignment]
    with pytest.raises(ConfigError, match="nested more than"):
        validate_config({"scheduler": deep})
    with pytest.raises(ConfigError, match="nested more than"):
        nested: object = 1
        for _ in range(40):
            nested = [nested]
        check_nesting(nested, "x")


def test_dotted_parts_accepts_real_keys() -> None:
    assert dotted_parts("models.digits-classifier.dynamic_batching.max_queue_size") == [
        "models",
        "digits-classifier",
        "dynamic_batching",
        "max_queue_size",
    ]


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ({"workers.heartbeat_timeout": "400d"}, "at most 366d"),
        ({"workers.start_timeout": 10**12}, "at most 366d"),
        ({"workers.shared_memory": "2048TB"}, "at most 1PB"),
        ({"workers.restart_backoff_reset_batches": 10**30}, "past the largest number"),
        ({"server.max_connections": 10**20}, "past the largest number"),
    ],
)
def test_numbers_without_a_range_of_their_own_still_have_a_ceiling(
    override: dict[str, object], needle: str
) -> None:
    """Issue 27's follow-up: workers, executor and the other sections bounded too."""
    with pytest.raises(ConfigError) as raised:
        load_config(None, override)
    key = next(iter(override))
    assert key in raised.value.message and needle in raised.value.message


def test_a_ray_actor_asking_for_1e300_cpus_is_refused() -> None:
    from pydantic import ValidationError

    from sordino.config.executor import RayModelOptions

    with pytest.raises(ValidationError, match="past the largest number"):
        RayModelOptions.model_validate({"num_cpus": 1e300})


def test_a_bool_inside_a_list_of_numbers_is_refused() -> None:
    from pydantic import ValidationError

    from sordino.config.scheduler import DynamicBatchingStrategy

    base = {"name": "dynamic_batching", "min_batch": 1, "max_batch": 8}
    ok = DynamicBatchingStrategy.model_validate({**base, "preferred_batch": [2, 4]})
    assert ok.preferred_batch == (2, 4)
    with pytest.raises(ValidationError, match=r"preferred_batch\.0"):
        DynamicBatchingStrategy.model_validate({**base, "preferred_batch": [True, 4]})
