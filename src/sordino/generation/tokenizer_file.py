"""A Hugging Face ``tokenizer.json`` read with the ``tokenizers`` wheel, or a clear error."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer


def read_tokenizer_json(file: Path) -> Tokenizer:
    """The tokenizer saved in ``file``; a ``ValueError`` naming the file and what to do
    when the installed ``tokenizers`` cannot read it (it raises a bare ``Exception``,
    "data did not match any variant of untagged enum …", for a format newer than it)."""
    import tokenizers

    try:
        return tokenizers.Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises nothing narrower
        raise ValueError(
            f"{file} cannot be read by tokenizers {tokenizers.__version__} ({exc}); a file "
            "saved by a newer transformers needs a newer tokenizers: pip install -U tokenizers"
        ) from None
