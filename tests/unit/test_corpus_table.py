"""`corpus_table`: the batch's corpus walk in tensor ops gives what `corpus_lookup.CorpusLookup` gives one request at
a time, reading no tensor data back to the host."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from peagle_vllm.corpus_lookup import SAMPLED_AT_MOST, CorpusLookup, read_answers
from peagle_vllm.corpus_table import CorpusTable, context_hashes
from peagle_vllm.harness.fake_tensors import on_fake


def _tails(texts: list[np.ndarray], width: int) -> torch.Tensor:
    """[B, width] each text's last tokens, nearest first, -1 past its start."""
    tail = torch.full((len(texts), width), -1, dtype=torch.long)
    for b, text in enumerate(texts):
        last = text[::-1][:width].copy()
        tail[b, :len(last)] = torch.from_numpy(last)
    return tail


def _answers(rng: np.random.Generator, vocab: int, count: int, offset: int = 0) -> list[tuple[list[int], list[int]]]:
    """Answers over a few tokens (contexts repeat, many with several next tokens), a prompt tail before each."""
    return [((offset + rng.integers(0, vocab, rng.integers(0, 10))).tolist(),
             (offset + rng.integers(0, vocab, rng.integers(1, 40))).tolist()) for _ in range(count)]


@pytest.mark.parametrize("vocab,count,offset", [(3, 60, 0), (6, 400, 0), (40, 400, 0), (4, 200, 70_000)])
def test_each_requests_drafts_are_the_corpus_walks(vocab: int, count: int, offset: int) -> None:
    rng = np.random.default_rng(vocab * count)
    answers = _answers(rng, vocab, count, offset)
    for min_n, min_prob in ((1, 0.2), (2, 0.5), (3, 0.05)):
        lookup = CorpusLookup(answers, min_n=min_n, min_prob=min_prob)
        table = CorpusTable.of(lookup)
        assert table.max_n == lookup.max_n == (6 if offset else 8)
        texts = [offset + rng.integers(0, vocab, rng.integers(1, 14)) for _ in range(300)]
        texts += [np.asarray((tail + answer)[:rng.integers(1, len(tail + answer) + 1)])
                  for tail, answer in answers[:100]]
        k = int(rng.integers(1, 9))
        drafts, found = table.continuation(_tails(texts, table.max_n), k)
        assert drafts.shape == (len(texts), k) and drafts.dtype == found.dtype == torch.long
        lengths = []
        for b, text in enumerate(texts):
            expected = lookup.continuation(text, k).tolist()
            assert drafts[b, :found[b]].tolist() == expected, (text.tolist(), min_n, min_prob)
            assert not drafts[b, found[b]:].any()
            lengths.append(len(expected))
        assert sum(map(bool, lengths)) > 50 and max(lengths) > 1, "too few walks to test"


def test_the_targets_answers_walk_alike() -> None:
    """SmolLM2's answers to one set of prompts as the corpus, texts cut from its answers to another set."""
    data = Path(__file__).resolve().parents[2] / "datasets" / "smollm2"
    lookup = CorpusLookup(read_answers(data / "requests"))
    table = CorpusTable.of(lookup)
    rng = np.random.default_rng(0)
    others = read_answers(data / "questions")
    texts = []
    for i in rng.choice(len(others), 300, replace=False):
        text = others[i][0] + others[i][1]
        texts.append(np.asarray(text[:rng.integers(len(others[i][0]), len(text) + 1)]))
    drafts, found = table.continuation(_tails(texts, table.max_n), 6)
    for b, text in enumerate(texts):
        assert drafts[b, :found[b]].tolist() == lookup.continuation(text, 6).tolist()
    assert (found > 0).sum() > 100 and found.max() == 6


def test_contexts_seen_thousands_of_times_count_the_lookups_sample() -> None:
    """Short contexts over two tokens occur more than 2 x SAMPLED_AT_MOST times: counted over CorpusLookup's
    evenly spaced sample, whose frequencies differ from the full counts."""
    rng = np.random.default_rng(5)
    answers = [([], rng.choice(2, size=50, p=[0.7, 0.3]).tolist()) for _ in range(400)]
    lookup = CorpusLookup(answers, min_n=1, min_prob=0.0)
    table = CorpusTable.of(lookup)
    assert lookup.tokens > 4 * SAMPLED_AT_MOST * 2
    texts = [rng.integers(0, 2, rng.integers(1, 6)) for _ in range(100)]
    drafts, found = table.continuation(_tails(texts, table.max_n), 3)
    for b, text in enumerate(texts):
        assert drafts[b, :found[b]].tolist() == lookup.continuation(text, 3).tolist()
    for c in (0, 1):  # the 1-token contexts: each sampled
        at = int(torch.searchsorted(table.hashes, context_hashes(torch.tensor([[c + 1]]), table.multipliers)[0, 0]))
        token = int(table.next_tokens[at])
        full = np.mean([a[i + 1] == token for _, a in answers for i in range(49) if a[i] == c])
        assert float(table.frequency[at]) != pytest.approx(full, abs=1e-9)


def _answer_of(table: CorpusTable, context: list[int]) -> tuple[int, float] | None:
    """The table's (next token, frequency) for a context (token ids, nearest first); None where it has none."""
    key = context_hashes(torch.tensor([[t + 1 for t in context]]), table.multipliers)[0, -1]
    at = int(torch.searchsorted(table.hashes, key))
    if at == len(table.hashes) or table.hashes[at] != key:
        return None
    return int(table.next_tokens[at]), float(table.frequency[at])


def test_a_context_with_one_next_token_has_no_longer_context_below_it() -> None:
    """After [1, 2] the corpus always has 3, so the table keeps no longer context ending in [1, 2], and a walk from
    any text ending in it still drafts 3 (frequency 1), then what follows [..., 1, 2, 3]."""
    lookup = CorpusLookup([([], [7, 1, 2, 3, 4]), ([], [8, 1, 2, 3, 5]), ([], [9, 9, 1, 2, 3, 4])], min_n=2)
    table = CorpusTable.of(lookup)
    assert _answer_of(table, [2, 1]) == (3, 1.0)
    assert _answer_of(table, [2, 1, 7]) is None and _answer_of(table, [2, 1, 9]) is None
    assert _answer_of(table, [3, 2, 1]) == (4, 2 / 3)  # 4, 5, 4 after 1 2 3
    drafts, found = table.continuation(_tails([np.array([6, 6, 1, 2])], table.max_n), 3)
    assert drafts[0, :found[0]].tolist() == lookup.continuation(np.array([6, 6, 1, 2]), 3).tolist() == [3, 4]


def test_the_walk_reads_nothing_back_to_the_host() -> None:
    rng = np.random.default_rng(0)
    table = CorpusTable.of(CorpusLookup(_answers(rng, 5, 50), min_n=2))
    mode = FakeTensorMode()
    fake = table.with_tensors(*map(mode.from_tensor, table.tensors))
    drafts, found = on_fake(fake.continuation, torch.randint(-1, 5, (3, table.max_n)), 4, mode=mode)
    assert drafts.shape == (3, 4) and found.shape == (3,)


def test_texts_the_corpus_never_continues_find_nothing() -> None:
    table = CorpusTable.of(CorpusLookup([([], [1, 2, 3])], min_n=3))
    texts = [np.array([5]), np.array([1, 2]), np.array([4, 1, 2]), np.array([3, 2])]  # [1, 2] needs its start
    drafts, found = table.continuation(_tails(texts, table.max_n), 2)
    assert found.tolist() == [0, 0, 0, 0] and not drafts.any()
    empty = CorpusTable.of(CorpusLookup([([], [1, 2])], min_n=3))  # no context of 3 tokens
    assert len(empty.hashes) == 0 and not empty.continuation(_tails(texts, empty.max_n), 2)[1].any()
