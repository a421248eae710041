"""Prompt lookup (`peagle_vllm.lookup`) on token arrays: which continuation it finds, and how it chains with the
head's drafts."""

from __future__ import annotations

import numpy as np
import pytest

from peagle_vllm.lookup import PromptLookup, TokenHistory, chain


def found(tokens: list[int], k: int = 4, min_n: int = 2, max_n: int = 5) -> list[int]:
    return PromptLookup(min_n, max_n).continuation(np.array(tokens), k).tolist()


def test_the_latest_occurrence_of_the_suffix_gives_the_continuation() -> None:
    #        0  1  2  3  4  5  6  7  8  9 10 11 12
    tokens = [1, 2, 3, 4, 9, 2, 3, 4, 7, 5, 2, 3, 4]
    assert found(tokens) == [7, 5, 2, 3]  # "2 3 4" ends at 3 and at 7: the later one


def test_a_longer_match_beats_a_nearer_shorter_one_within_max_n() -> None:
    tokens = [8, 2, 3, 4, 6, 1, 3, 4, 7, 8, 2, 3, 4]
    assert found(tokens) == [6, 1, 3, 4]  # "8 2 3 4" (n=4) at 0..3
    assert found(tokens, max_n=2) == [7, 8, 2, 3]  # n=2 at most: "3 4" at 6..7, the nearer


def test_matches_shorter_than_min_n_give_nothing() -> None:
    tokens = [5, 1, 7, 2, 1]
    assert found(tokens) == []  # only "1" recurs
    assert found(tokens, min_n=1) == [7, 2, 1]


def test_no_earlier_occurrence_short_context_and_k_zero_give_nothing() -> None:
    assert found([1, 2, 3, 4]) == []
    assert found([3, 3]) == []  # not longer than min_n
    assert found([1, 2, 1, 2], k=0) == []


def test_a_continuation_ends_where_the_tokens_do() -> None:
    assert found([5, 6, 5, 6, 5, 6], k=4) == [5, 6]  # "5 6 5 6" at 0..3, then only two tokens follow


def naive(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    for n in range(max_n, min_n - 1, -1):
        if len(tokens) <= n:
            continue
        for end in range(len(tokens) - 2, n - 2, -1):
            if tokens[end - n + 1: end + 1] == tokens[-n:]:
                return tokens[end + 1: end + 1 + k]
    return []


@pytest.mark.parametrize("min_n,max_n", [(1, 1), (2, 5), (3, 4), (1, 6)])
def test_agrees_with_a_direct_search_on_random_text(min_n: int, max_n: int) -> None:
    rng = np.random.default_rng(min_n * 10 + max_n)
    for _ in range(300):
        tokens = rng.integers(0, 4, size=int(rng.integers(1, 40))).tolist()
        assert found(tokens, 6, min_n, max_n) == naive(tokens, 6, min_n, max_n), tokens


class Table:
    """A lookup that continues a text by a fixed table: last token -> the tokens that follow it."""

    def __init__(self, table: dict[int, list[int]]) -> None:
        self.table, self.asked = table, []

    def continuation(self, tokens: np.ndarray, k: int) -> np.ndarray:
        self.asked.append(tokens.tolist())
        return np.array(self.table.get(int(tokens[-1]), [])[:k], dtype=np.int64)


def test_chain_looks_up_again_past_each_of_the_heads_drafts() -> None:
    text = np.array([5, 6], dtype=np.int64)
    lookup = Table({6: [7, 7], 2: [9]})  # after the text: 7 7; after the head's depth-2 draft (2): 9
    drafts, by_lookup = chain(lookup, text, [1, 1, 2, 3, 4, 5], 6)
    assert (drafts, by_lookup) == ([7, 7, 2, 9, 4, 5], [True, True, False, True, False, False])
    # each lookup saw the text and the drafts before its depth
    assert lookup.asked[:3] == [[5, 6], [5, 6, 7, 7], [5, 6, 7, 7, 2]]


def test_chain_ends_at_k_or_past_the_heads_depth_where_the_lookup_finds_nothing() -> None:
    text = np.array([5, 6], dtype=np.int64)
    assert chain(Table({6: [7] * 9}), text, [1, 2], 4) == ([7, 7, 7, 7], [True] * 4)  # k kept
    assert chain(Table({}), text, [1, 2, 3, 4], 4) == ([1, 2, 3, 4], [False] * 4)  # the head's alone
    assert chain(Table({6: [7, 8]}), text, [1, 2], 8) == ([7, 8], [True, True])  # past the head's 2 depths: lookups only
    assert chain(Table({2: [9, 9]}), text, [1, 2], 8) == ([1, 2, 9, 9], [False, False, True, True])
    assert chain(Table({}), text, [], 4) == ([], [])


def test_token_history_copies_only_what_was_appended_and_matches_the_text() -> None:
    history, text = TokenHistory(), list(range(10))
    first = history.of("r", text)
    assert first.tolist() == text
    text += [7, 8, 9] * 40  # past the buffer's first capacity
    again = history.of("r", text)
    assert again.tolist() == text
    history.of("s", [1, 2, 3])  # requests are kept apart
    assert history.of("r", text).tolist() == text
    assert history.of("r", [4, 5]).tolist() == [4, 5]  # a shorter text is taken anew
    history.forget("r")
    assert history.of("r", [6]).tolist() == [6]
