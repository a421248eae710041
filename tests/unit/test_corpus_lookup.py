"""Corpus lookup (`peagle_vllm.corpus_lookup`): the walk checked against a direct search of the answers."""

from __future__ import annotations

import gzip
import json
import random
from collections import Counter

import numpy as np
import pytest

from peagle_vllm.corpus_lookup import CorpusError, CorpusLookup, read_answers
from peagle_vllm.lookup import FirstFound, PromptLookup


def _direct(answers, text: list[int], k: int, min_n: int, max_n: int, min_prob: float) -> list[int]:
    """The walk by brute force: for each draft, the longest suffix of the text (min_n..max_n) that ends right before
    an answer token somewhere (within its answer's last max_n prompt tokens and the answer), its most frequent next
    token (the smallest id among ties), while the product of those frequencies stays >= min_prob."""
    out, prob, text = [], 1.0, list(text)
    while len(out) < k:
        for n in range(min(max_n, len(text)), min_n - 1, -1):
            after = Counter(seq[i + n] for tail, a in answers for seq in [tail[-max_n:] + a]
                            for i in range(max(0, len(tail[-max_n:]) - n), len(seq) - n) if seq[i:i + n] == text[-n:])
            if after:
                break
        else:
            return out
        top = max(after.values())
        prob *= top / sum(after.values())
        if prob < min_prob:
            return out
        out.append(min(t for t, c in after.items() if c == top))
        text.append(out[-1])
    return out


@pytest.mark.parametrize("vocab,big_ids", [(4, False), (7, False), (5, True)])
def test_the_walk_is_the_direct_search(vocab: int, big_ids: bool) -> None:
    rng = random.Random(vocab)
    offset = 70_000 if big_ids else 0  # ids past 16 bits: three to a word instead of four
    answers = [([offset + rng.randrange(vocab) for _ in range(rng.randrange(0, 12))],
                [offset + rng.randrange(vocab) for _ in range(rng.randrange(1, 30))]) for _ in range(40)]
    corpus = CorpusLookup(answers, min_n=2, min_prob=0.2)
    assert corpus.max_n == (6 if big_ids else 8)
    checked = 0
    for _ in range(300):
        text = [offset + rng.randrange(vocab) for _ in range(rng.randrange(1, 14))]
        expected = _direct(answers, text, 5, 2, corpus.max_n, 0.2)
        assert corpus.continuation(np.array(text), 5).tolist() == expected, text
        checked += bool(expected)
    assert checked > 100, "too few texts found a continuation to test the walk"


def test_an_answer_seen_before_is_walked_to_its_end() -> None:
    answer = [5, 9, 2, 7, 7, 3, 8, 1]
    corpus = CorpusLookup([([1, 4], answer), ([1, 4], [6, 6, 6])], min_n=2, min_prob=0.6)
    assert corpus.continuation(np.array([0, 5, 9, 2]), 8).tolist() == [7, 7, 3, 8, 1]
    assert corpus.continuation(np.array([2, 6]), 4).tolist() == []  # never in an answer
    assert corpus.continuation(np.array([1, 4]), 3).tolist() == []  # 5 or 6 after [1, 4]: a 0.5 chance each ...
    alone = CorpusLookup([([1, 4], answer)], min_n=2)
    assert alone.continuation(np.array([1, 4]), 2).tolist() == [5, 9]  # ... here, one


def test_prompt_lookup_comes_first() -> None:
    corpus = CorpusLookup([([], [3, 4, 5, 6, 7])], min_n=2)
    both = FirstFound((PromptLookup(2, 5), corpus))
    assert both.continuation(np.array([3, 4, 9, 3, 4]), 2).tolist() == [9, 3]  # the text's own, not the corpus's
    assert both.continuation(np.array([8, 3, 4]), 2).tolist() == [5, 6]
    assert both.continuation(np.array([8, 1, 2]), 2).tolist() == []


def test_answers_are_read_from_distill_output(tmp_path) -> None:
    rows = [{"prompt": "p", "prompt_ids": [1, 2], "response_ids": [3, 4], "temperature": 0.0, "finished": True}]
    (tmp_path / "a").mkdir()
    with gzip.open(tmp_path / "a" / "chunk-0000.jsonl.gz", "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows * 2))
    (tmp_path / "chunk-0001.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert read_answers(tmp_path, vocab_size=5) == [([1, 2], [3, 4])] * 3
    with pytest.raises(CorpusError, match="token id 4 is outside the target's vocabulary of 4"):
        read_answers(tmp_path, vocab_size=4)
    (tmp_path / "chunk-0002.jsonl").write_text('{"prompt_ids": [1]}\n')
    with pytest.raises(CorpusError, match="chunk-0002.jsonl: not answers .* KeyError"):
        read_answers(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="no answers found"):
        read_answers(tmp_path / "empty")
