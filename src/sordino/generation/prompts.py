"""Text prompts of the built-in digit generator: "a handwritten 7", "seven", "draw a three"."""

from __future__ import annotations

import re

from sordino.errors import InvalidRequest

__all__ = ["DIGIT_WORDS", "parse_digit_prompt"]

DIGIT_WORDS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
)
_ALIASES = {"oh": 0, "nought": 0, "naught": 0}
_WORD = re.compile(r"[a-z]+|\d+")


def parse_digit_prompt(prompt: str) -> int:
    """Return the digit (0-9) a prompt asks for; raise InvalidRequest saying what is understood.

    The prompt must name exactly one digit, as a numeral ("7") or a word ("seven");
    other words ("a", "handwritten", "draw") are ignored.
    """
    found: set[int] = set()
    for token in _WORD.findall(prompt.lower()):
        if token.isdigit():
            if len(token) == 1:
                found.add(int(token))
            else:
                found.add(-1)  # "12": not one digit
        elif token in DIGIT_WORDS:
            found.add(DIGIT_WORDS.index(token))
        elif token in _ALIASES:
            found.add(_ALIASES[token])
    if len(found) == 1 and -1 not in found:
        return found.pop()
    shown = prompt if len(prompt) <= 80 else prompt[:77] + "..."
    problem = "names more than one digit" if len(found) > 1 else "names no digit"
    raise InvalidRequest(
        f"the prompt {shown!r} {problem}; this model draws one handwritten digit: name it "
        f"as a numeral 0-9 or a word ({', '.join(DIGIT_WORDS)}), e.g. 'a handwritten 7', "
        "'seven', '7' or 'draw a three'"
    )
