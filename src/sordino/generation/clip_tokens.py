"""CLIP's tokenizer, read from an export's ``tokenizer/`` folder with the ``tokenizers`` library.

A diffusers export keeps the tokenizer as transformers saved it: ``vocab.json`` and
``merges.txt`` (a slow ``CLIPTokenizer``), sometimes also ``tokenizer.json`` (the fast
one). :class:`ClipTokenizer` builds the same tokenizer transformers' fast conversion does
(NFC, whitespace folded, lower-case; CLIP's split pattern; byte-level BPE with the
``</w>`` word suffix; ``<|startoftext|>`` ... ``<|endoftext|>`` around the tokens), then
truncates and pads every prompt to ``model_max_length`` (77) as diffusers' pipelines ask
(``padding="max_length", truncation=True``). No torch, no transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from sordino.generation.tokenizer_file import read_tokenizer_json

__all__ = ["ClipTokenizer"]

_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
_MAX_MERGES = 49152 - 256 - 2  # the merges a slow CLIPTokenizer reads from merges.txt


class ClipTokenizer:
    """Prompts to ``input_ids`` [B, max_length] (INT64) the way diffusers tokenizes them."""

    def __init__(self, folder: Path) -> None:
        from tokenizers import (
            AddedToken,
            Regex,
            Tokenizer,
            decoders,
            normalizers,
            pre_tokenizers,
            processors,
        )
        from tokenizers.models import BPE

        settings = _read_json(folder / "tokenizer_config.json")
        specials = _read_json(folder / "special_tokens_map.json")
        self.max_length = int(settings.get("model_max_length", 77))
        if not 2 <= self.max_length <= 4096:
            self.max_length = 77  # transformers writes a huge number when it had none
        bos = _token(settings, specials, "bos_token", "<|startoftext|>")
        eos = _token(settings, specials, "eos_token", "<|endoftext|>")
        unk = _token(settings, specials, "unk_token", eos)
        pad = _token(settings, specials, "pad_token", eos)
        if (folder / "tokenizer.json").is_file():
            tokenizer = read_tokenizer_json(folder / "tokenizer.json")
        else:
            vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
            lines = (folder / "merges.txt").read_text(encoding="utf-8").strip().split("\n")
            merges = [_pair(line) for line in lines[1 : _MAX_MERGES + 1]]
            tokenizer = Tokenizer(
                BPE(
                    vocab=vocab,
                    merges=merges,
                    continuing_subword_prefix="",
                    end_of_word_suffix="</w>",
                    fuse_unk=False,
                    unk_token=unk,
                )
            )
            tokenizer.normalizer = normalizers.Sequence(
                [
                    normalizers.NFC(),
                    normalizers.Replace(Regex(r"\s+"), " "),
                    normalizers.Lowercase(),
                ]
            )
            tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
                [
                    pre_tokenizers.Split(Regex(_SPLIT), behavior="removed", invert=True),
                    pre_tokenizers.ByteLevel(add_prefix_space=False),
                ]
            )
            tokenizer.decoder = decoders.ByteLevel()
            # sep and cls by position: the keyword for cls differs between versions.
            tokenizer.post_processor = processors.RobertaProcessing(
                (eos, _id(tokenizer, eos)),
                (bos, _id(tokenizer, bos)),
                add_prefix_space=False,
                trim_offsets=False,
            )
            tokenizer.add_special_tokens([AddedToken(t, normalized=True) for t in (bos, eos)])
        # transformers splits every special token out of the text before BPE, the pad token
        # too: SDXL's and SD3's second tokenizer pads with "!", so "night!" ends in "!",
        # not "!</w>".
        if pad not in (bos, eos, unk) and tokenizer.token_to_id(pad) is not None:
            tokenizer.add_special_tokens([AddedToken(pad, normalized=False)])
        tokenizer.enable_truncation(max_length=self.max_length)
        tokenizer.enable_padding(length=self.max_length, pad_id=_id(tokenizer, pad), pad_token=pad)
        self._tokenizer = tokenizer

    def __call__(self, prompts: list[str]) -> npt.NDArray[np.int64]:
        """``input_ids`` of ``prompts``, each truncated or padded to ``max_length``."""
        encoded = self._tokenizer.encode_batch(prompts)
        return np.array([e.ids for e in encoded], dtype=np.int64)


def _pair(line: str) -> tuple[str, str]:
    first, _, second = line.partition(" ")
    return first, second


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    return value if isinstance(value, dict) else {}


def _token(settings: dict[str, Any], specials: dict[str, Any], key: str, default: str) -> str:
    value = settings.get(key, specials.get(key, default))
    if isinstance(value, dict):
        value = value.get("content", default)
    return str(value) if value else default


def _id(tokenizer: Any, token: str) -> int:
    found = tokenizer.token_to_id(token)
    if found is None:
        raise ValueError(f"the tokenizer's vocabulary has no {token!r}")
    return int(found)
