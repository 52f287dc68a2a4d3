"""The bounded memo (``sordino/memo.py``) the transports and the codec keep."""

from __future__ import annotations

import pytest

from sordino.memo import Memo


def test_a_value_is_worked_out_once_a_key_and_then_read() -> None:
    made: list[str] = []

    def make(key: str) -> int:
        made.append(key)
        return len(key)

    memo: Memo[str, int] = Memo(make, 4)
    assert [memo["ab"], memo["abc"], memo["ab"], memo["abc"]] == [2, 3, 2, 3]
    assert made == ["ab", "abc"]
    assert memo.get("zz") is None and "zz" not in memo  # get and in do not make


def test_a_full_memo_forgets_everything_and_keeps_the_new_key() -> None:
    made: list[int] = []

    def make(key: int) -> int:
        made.append(key)
        return key * 10

    memo: Memo[int, int] = Memo(make, 3)
    for key in (1, 2, 3):
        assert memo[key] == key * 10
    assert memo[4] == 40  # the fourth key: the three before are forgotten
    assert dict(memo) == {4: 40}
    assert memo[1] == 10 and made == [1, 2, 3, 4, 1]


def test_a_value_of_none_is_kept_too() -> None:
    calls = 0

    def make(key: bytes) -> None:
        nonlocal calls
        calls += 1
        return None

    memo: Memo[bytes, None] = Memo(make, 8)
    assert memo[b"x"] is None and memo[b"x"] is None
    assert calls == 1


def test_a_memo_keeps_at_least_one_entry() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Memo(str, 0)
