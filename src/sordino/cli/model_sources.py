"""The model versions ``sordino start`` loads: configuration entries, ``--model``
specs, the built-in and example models, the repositories."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from sordino.config import RuntimeConfig
from sordino.errors import ConfigError

if TYPE_CHECKING:
    from sordino.models.repository import ModelSource

__all__ = ["collect_sources"]

log = logging.getLogger("sordino")


def collect_sources(
    config: RuntimeConfig,
    specs: tuple[str, ...],
    builtin: bool | None,
    triton_examples: bool = False,
    broken: dict[str, str] | None = None,
) -> list[ModelSource]:
    """Every model version to load: config entries, ``--model`` specs, the repository.

    The built-in models are added when ``builtin`` is true, or when it is None and no
    model source was named at all; Triton's example models when ``triton_examples``
    is true. A repository that holds no model is a
    configuration error when nothing at all would be served (model control ``none``),
    and a warning otherwise. Two models with the same name are a configuration error.

    With ``broken`` (explicit model control, or ``server.exit_on_error`` false: where a
    folder that cannot be read need not end start-up, see :func:`left_out`), a
    repository model that cannot be read is left out and its error kept there by name,
    instead of raised.
    """
    from sordino.models.repositories import scan_repositories
    from sordino.models.repository import (
        builtin_sources,
        sources_for,
        sources_from_spec,
        triton_example_sources,
    )  # fmt: skip

    sources: list[ModelSource] = []
    for model in config.models:
        sources += sources_for(model)
    for spec in specs:
        sources += sources_from_spec(spec)
    if builtin or (builtin is None and not (sources or config.model_repository)):
        sources = builtin_sources() + sources
    if triton_examples:
        sources = triton_example_sources() + sources
    if config.repositories:
        found = scan_repositories(config.repositories, broken)  # a name in two: refused
        for root in config.repositories:
            if not any(source.path.is_relative_to(root) for source in found):
                _empty_repository(root, config.server.model_control_mode, sources + found)
        sources += found
    seen: dict[tuple[str, str], ModelSource] = {}
    for source in sources:
        key = (source.name, source.version)
        if key in seen:
            raise ConfigError(
                f"model {source.name!r} version {source.version} is given twice "
                f"({seen[key].path} and {source.path}); rename one with --model name=path"
            )
        seen[key] = source
    if not sources and config.model_repository is None:
        raise ConfigError("no models to serve: give --model, --model-repository or --builtin")
    return sources


def left_out(
    broken: dict[str, str], config: RuntimeConfig, load_models: tuple[str, ...]
) -> dict[str, str]:
    """Repository folders that cannot be read at start-up (``broken``: their errors by
    name), as Triton treats them; return those to show UNAVAILABLE with their error.

    In explicit model control only what ``load_models`` names is read at start (as
    Triton's ``--load-model``): another is said and left out, where the server would
    have refused to start for a model it was not asked to load (its load says why). A
    model the start-up loads ends start-up (:class:`ConfigError`), unless
    ``server.exit_on_error`` is false: then it is left out UNAVAILABLE with its error
    while the others serve, as a model whose load failed is.
    """
    explicit = config.server.model_control_mode == "explicit"
    kept: dict[str, str] = {}
    for name, why in broken.items():
        if explicit and name not in load_models:
            log.warning(
                "model %s cannot be loaded as it is (%s); explicit model control serves on "
                "without it: fix it, then `sordino models load %s`",
                name,
                why,
                name,
            )
        elif config.server.exit_on_error:
            raise ConfigError(f"--load-model {name}: {why}" if explicit else why)
        else:
            log.error("start-up: %s; serving the others (exit_on_error false)", why)
            kept[name] = why
    return kept


def _empty_repository(root: Path, mode: str, others: list[ModelSource]) -> None:
    """Refuse a repository without models when nothing would be served; warn otherwise."""
    layout = f"one folder per model, such as {root / 'NAME' / '1' / 'model.onnx'}"
    if mode == "none" and not others:
        raise ConfigError(
            f"model repository {root} holds no models, so there is nothing to serve: add "
            f"{layout}; or pass --builtin for the demo models, or --model-control-mode "
            "explicit or poll to add models while serving"
        )
    later = {
        "poll": "; poll mode loads them as they appear",
        "explicit": "; load them with `sordino models load NAME`",
    }.get(mode, "")
    log.warning("model repository %s holds no models (expected %s)%s", root, layout, later)
