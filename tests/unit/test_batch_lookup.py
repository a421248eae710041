"""`batch_lookup`: the batch's prompt lookup in tensor ops gives what `lookup.PromptLookup` gives one request at a
time, and `lookup_first` puts it before the head's drafts for the requests that take it; `first_found` tries lookups
in turn."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from peagle_vllm.batch_lookup import first_found, last_tokens, lookup_first, prompt_lookup
from peagle_vllm.lookup import PromptLookup


@pytest.mark.parametrize("seed", range(4))
def test_each_requests_continuation_is_prompt_lookups(seed: int) -> None:
    rng = np.random.default_rng(seed)
    for _ in range(100):
        slots, width = 6, 40
        token_ids = torch.tensor(rng.integers(0, int(rng.integers(2, 8)), size=(slots, width)), dtype=torch.int32)
        lengths = torch.tensor(rng.integers(0, width + 1, size=slots), dtype=torch.int32)
        rows = torch.tensor(rng.permutation(slots)[:4])
        min_n = int(rng.integers(1, 4))
        max_n, k = int(rng.integers(min_n, 6)), int(rng.integers(1, 9))
        continuations, found = prompt_lookup(token_ids, rows, lengths, k, min_n, max_n)
        assert continuations.shape == (4, k) and continuations.dtype == torch.long
        for b, slot in enumerate(rows.tolist()):
            text = token_ids[slot, :lengths[slot]].numpy().astype(np.int64)  # the slot's row past it: other tokens
            assert continuations[b, :found[b]].tolist() == PromptLookup(min_n, max_n).continuation(text, k).tolist()
            assert not continuations[b, found[b]:].any()


def test_the_longest_suffix_then_its_latest_occurrence_wins() -> None:
    text = [7, 1, 2, 3, 9, 9, 5, 2, 3, 8, 1, 2, 3]  # suffix 1 2 3 at 1..3 (n=3); 2 3 later at 7..8 (n=2 only)
    token_ids = torch.tensor([text + [0] * 3])
    continuations, found = prompt_lookup(token_ids, torch.tensor([0]), torch.tensor([len(text)]), 4, 2, 5)
    assert found.tolist() == [4] and continuations.tolist() == [[9, 9, 5, 2]]
    continuations, found = prompt_lookup(token_ids, torch.tensor([0]), torch.tensor([len(text)]), 4, 2, 2)
    assert found.tolist() == [4] and continuations.tolist() == [[8, 1, 2, 3]]  # n=2: the latest, at 7..8


def test_lookups_fill_the_first_depths_of_the_requests_that_take_them() -> None:
    head = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]])
    continuations = torch.tensor([[1, 2, 0, 0], [4, 0, 0, 0], [5, 6, 7, 8]])
    found = torch.tensor([2, 0, 4])
    drafts, taken = lookup_first(head, continuations, found, use=torch.tensor([True, True, False]))
    assert drafts.tolist() == [[1, 2, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]]
    assert taken.tolist() == [[True, True, False, False], [False] * 4, [False] * 4]


def test_last_tokens_are_read_nearest_first() -> None:
    token_ids = torch.tensor([[1, 2, 3, 4, 0], [5, 6, 0, 0, 0], [7, 0, 0, 0, 0]], dtype=torch.int32)
    tails = last_tokens(token_ids, torch.tensor([2, 0, 1]), torch.tensor([4, 2, 0]), 3)
    assert tails.dtype == torch.long
    assert tails.tolist() == [[-1, -1, -1], [4, 3, 2], [6, 5, -1]]  # slot 2 holds no token yet


def test_the_first_lookup_that_finds_wins() -> None:
    prompt = (torch.tensor([[1, 2, 0], [0, 0, 0], [0, 0, 0]]), torch.tensor([2, 0, 0]))
    corpus = (torch.tensor([[7, 7, 7], [8, 9, 0], [0, 0, 0]]), torch.tensor([3, 2, 0]))
    continuations, found = first_found(prompt, corpus)
    assert continuations.tolist() == [[1, 2, 0], [8, 9, 0], [0, 0, 0]] and found.tolist() == [2, 2, 0]
    assert first_found(corpus)[1] is corpus[1]
