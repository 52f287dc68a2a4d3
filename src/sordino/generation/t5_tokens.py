"""T5's tokenizer, read from an SD3 export's ``tokenizer_3/tokenizer.json`` with ``tokenizers``.

transformers saves a ``T5TokenizerFast`` (the one an SD3 pipeline holds) as
``tokenizer.json``, which the ``tokenizers`` library reads as it is: its normalizer, the
Unigram model, and the post-processor that appends ``</s>``. :class:`T5Tokenizer`
truncates and pads every prompt to ``max_length`` tokens with ``<pad>`` as diffusers'
``StableDiffusion3Pipeline`` asks (``padding="max_length", truncation=True,
add_special_tokens=True``, ``max_length=max_sequence_length``, 256 by default). A folder
with only the sentencepiece model (``spiece.model``) is refused: converting it needs
sentencepiece and transformers; ``save_pretrained`` of a fast tokenizer writes the JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import numpy.typing as npt

from sordino.generation.tokenizer_file import read_tokenizer_json

__all__ = ["T5Tokenizer"]


class T5Tokenizer:
    """Prompts to ``input_ids`` [B, max_length] (INT64) the way diffusers tokenizes them for T5."""

    def __init__(self, folder: Path, max_length: int) -> None:
        file = folder / "tokenizer.json"
        if not file.is_file():
            raise ValueError(
                f"{folder} has no tokenizer.json (a slow sentencepiece tokenizer alone is not "
                "read); save the tokenizer with transformers' T5TokenizerFast.save_pretrained, "
                "as optimum's export does"
            )
        tokenizer = read_tokenizer_json(file)
        pad = "<pad>"
        config = folder / "tokenizer_config.json"
        if config.is_file():
            settings = json.loads(config.read_text(encoding="utf-8"))
            value = settings.get("pad_token", pad) if isinstance(settings, dict) else pad
            pad = str(value.get("content", pad) if isinstance(value, dict) else value or pad)
        pad_id = tokenizer.token_to_id(pad)
        if pad_id is None:
            raise ValueError(f"the tokenizer's vocabulary has no pad token {pad!r}")
        self.max_length = max_length
        tokenizer.enable_truncation(max_length=max_length)
        tokenizer.enable_padding(length=max_length, pad_id=pad_id, pad_token=pad)
        self._tokenizer = tokenizer

    def __call__(self, prompts: list[str]) -> npt.NDArray[np.int64]:
        """``input_ids`` of ``prompts``, each ending in ``</s>``, padded to ``max_length``."""
        encoded = self._tokenizer.encode_batch(prompts, add_special_tokens=True)
        return np.array([e.ids for e in encoded], dtype=np.int64)
