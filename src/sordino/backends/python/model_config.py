"""``triton_python_backend_utils.ModelConfig``: the configuration a Python model's
``auto_complete_config`` reads and completes."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sordino.backends.python.triton_errors import TritonModelException

__all__ = ["ModelConfig"]


class ModelConfig:
    """The configuration ``auto_complete_config`` reads and completes."""

    def __init__(self, model_config: Mapping[str, Any]) -> None:
        self._config: dict[str, Any] = json.loads(json.dumps(dict(model_config)))
        self._config.setdefault("input", [])
        self._config.setdefault("output", [])
        self._config.setdefault("max_batch_size", 0)

    def as_dict(self) -> dict[str, Any]:
        copy: dict[str, Any] = json.loads(json.dumps(self._config))
        return copy

    def set_max_batch_size(self, max_batch_size: int) -> None:
        self._config["max_batch_size"] = int(max_batch_size)

    def set_dynamic_batching(self) -> None:
        self._config.setdefault("dynamic_batching", {})

    def set_model_transaction_policy(self, transaction_policy_dict: Mapping[str, Any]) -> None:
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def add_input(self, input: Mapping[str, Any]) -> None:
        self._add("input", input)

    def add_output(self, output: Mapping[str, Any]) -> None:
        self._add("output", output)

    def _add(self, key: str, entry: Mapping[str, Any]) -> None:
        if "name" not in entry:
            raise TritonModelException(f"an {key} needs a name")
        for known in self._config[key]:
            if known["name"] == entry["name"]:
                for field in ("data_type", "dims"):
                    if field in known and field in entry and known[field] != entry[field]:
                        raise TritonModelException(
                            f"{key} {entry['name']!r}: {field} {entry[field]} differs from "
                            f"the configured {known[field]}"
                        )
                known.update({k: v for k, v in entry.items() if k not in known})
                return
        self._config[key].append(dict(entry))
