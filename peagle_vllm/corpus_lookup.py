"""Corpus lookup: drafts from answers the target wrote before (e.g. `peagle-vllm distill`'s, which trained the
head), for requests whose own text has no match for prompt lookup (`lookup.PromptLookup`).

Each step walks the corpus like a variable-order n-gram model: the longest suffix of the request's text (n from
`min_n` to `max_n`) found in the corpus decides the next draft, the most frequent token after its occurrences;
that token extends the text, and the walk goes on while the product of those frequencies stays >= `min_prob`.

Rules:
- The index holds, for every answer token, the tokens before it (reversed, packed 4 or 3 to a 64-bit word) and
  the token itself, sorted; a longer suffix narrows the range of a shorter one, so each n is two binary searches.
- An answer's context is its own tokens and the last prompt tokens (the chat template's assistant header), never
  another answer's.
No vLLM here: the scheduler hook applies it beside prompt lookup (`vllm_adapter/v1/prompt_lookup.py`).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np

DEFAULT_MIN_N, DEFAULT_MIN_PROB = 3, 0.5  # held-out measurement: docs/smollm2-results.md
SAMPLED_AT_MOST = 1024  # occurrences counted for the next token (evenly spaced) where a short n-gram has more


class CorpusLookup:
    """A variable-order n-gram walk over token sequences (`context tail + answer` each) for drafts."""

    def __init__(self, sequences: list[tuple[list[int], list[int]]], min_n: int = DEFAULT_MIN_N,
                 min_prob: float = DEFAULT_MIN_PROB) -> None:
        """sequences: (context tail, answer) token lists; min_n: shortest suffix matched; min_prob: the walk stops
        where the product of its tokens' frequencies would fall below it."""
        top = max((max(c + a) for c, a in sequences if c or a), default=0) + 1
        # bits per token, stored as id + 1 (0: before the context); a range's end adds 1 to a full word, which
        # must not wrap
        self.bits = 16 if top < (1 << 16) - 1 else 21
        if top >= (1 << 21):
            raise ValueError(f"token ids up to {top - 1} do not fit the index's 21 bits")
        self.per_word = 64 // self.bits
        self.max_n = 2 * self.per_word
        self.min_n, self.min_prob = min(min_n, self.max_n), min_prob
        self.answers, self.tokens = len(sequences), sum(len(a) for _, a in sequences)
        self._build(sequences)

    def _build(self, sequences: list[tuple[list[int], list[int]]]) -> None:
        tail = self.max_n
        # flat: each answer after `tail` zeros and its context's last `tail` tokens, ids + 1; ends [N]: the
        # positions whose next token is an answer token (a context ends there)
        pieces, ends, start = [], [], 0
        for context, answer in sequences:
            if not answer:
                continue
            context = context[-tail:]
            pieces.append(np.concatenate([np.zeros(tail, np.int64), np.asarray(context + answer, np.int64) + 1]))
            first = start + tail + len(context)  # the answer's first token
            ends.append(np.arange(first - 1, first + len(answer) - 1))
            start += len(pieces[-1])
        flat = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
        ends = np.concatenate(ends) if ends else np.zeros(0, np.int64)
        words = []
        for w in range(2):
            key = np.zeros(len(ends), dtype=np.uint64)
            for j in range(w * self.per_word, (w + 1) * self.per_word):  # the j-th token back from the end
                key = (key << np.uint64(self.bits)) | flat[ends - j].astype(np.uint64)
            words.append(key)
        order = np.lexsort((words[1], words[0]))
        # [N] each: the per_word tokens before the next one (nearest first), then the per_word before those
        self._first, self._second = words[0][order], words[1][order]
        self._next = (flat[ends + 1][order] - 1).astype(np.int32)  # [N]: the answer token that followed

    @property
    def follows(self) -> np.ndarray:
        """[N] the answer token after each index row (rows sorted by the tokens before it, nearest first)."""
        return self._next

    def token_back(self, n: int, rows: np.ndarray | None = None) -> np.ndarray:
        """[N] (or [len(rows)]) uint64: each index row's n-th token back (1: the nearest), as id + 1; 0 before its
        context."""
        column = self._first if n <= self.per_word else self._second
        column = column if rows is None else column[rows]
        shift = np.uint64(self.bits * (self.per_word - 1 - (n - 1) % self.per_word))
        return (column >> shift) & np.uint64((1 << self.bits) - 1)

    def _longest(self, tokens: np.ndarray) -> tuple[int, int, int]:
        """tokens [L] -> (lo, hi, n): the index range of the longest suffix n-gram found (n >= min_n); n 0: none."""
        found = (0, 0, 0)
        lo, hi, column = 0, len(self._next), self._first
        back = tokens[::-1][: self.max_n].astype(np.uint64) + np.uint64(1)
        prefix = np.uint64(0)
        for n in range(1, len(back) + 1):
            j = (n - 1) % self.per_word
            if j == 0 and n > 1:  # into the second word: ranges stay nested
                column, prefix = self._second, np.uint64(0)
            prefix = (prefix << np.uint64(self.bits)) | back[n - 1]
            shift = np.uint64(self.bits * (self.per_word - 1 - j))
            view = column[lo:hi]
            a = int(np.searchsorted(view, prefix << shift, "left"))
            b = int(np.searchsorted(view, (prefix + np.uint64(1)) << shift, "left"))
            if a == b:
                break
            lo, hi = lo + a, lo + b
            if n >= self.min_n:
                found = (lo, hi, n)
        return found

    def continuation(self, tokens: np.ndarray, k: int) -> np.ndarray:
        """tokens [L] (a request's text so far) -> up to k drafts [<= k] walked from the corpus; empty where the
        text's last `min_n` tokens never occurred before an answer token, or the first draft is too uncertain."""
        out, prob = [], 1.0
        text = np.asarray(tokens, dtype=np.int64)
        while len(out) < k:
            lo, hi, n = self._longest(text)
            if not n:
                break
            token, frequency = self.most_frequent(lo, hi)
            prob *= frequency
            if prob < self.min_prob:
                break
            out.append(token)
            text = np.append(text[-self.max_n:], token)
        return np.asarray(out, dtype=np.int64)

    def most_frequent(self, lo: int, hi: int) -> tuple[int, float]:
        """(token, frequency): the most frequent next token of index rows lo..hi-1 (the smallest on a tie) and its
        share, counted over every row, or over SAMPLED_AT_MOST to 2 x SAMPLED_AT_MOST evenly spaced ones."""
        seen = self._next[lo:hi:max(1, (hi - lo) // SAMPLED_AT_MOST)]
        values, counts = np.unique(seen, return_counts=True)
        best = int(counts.argmax())
        return int(values[best]), counts[best] / len(seen)


class CorpusError(ValueError):
    """A lookup corpus that cannot be read or does not fit the target; the message names the file and the fix."""


def read_answers(path: Path, vocab_size: int | None = None) -> list[tuple[list[int], list[int]]]:
    """A `peagle-vllm distill` output (a directory of `*.jsonl[.gz]`, searched recursively, or one such file; rows
    with `prompt_ids` and `response_ids`) -> (prompt ids, response ids) per row, every id below `vocab_size`."""
    files = sorted(path.rglob("*.jsonl*")) if path.is_dir() else [path]
    rows = []
    for f in files:
        opener = gzip.open if f.suffix == ".gz" else open
        try:
            with opener(f, "rt") as lines:
                rows += [(r["prompt_ids"], r["response_ids"]) for r in map(json.loads, filter(str.strip, lines))]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CorpusError(f"{f}: not answers as `peagle-vllm distill` writes them (JSON rows with prompt_ids and "
                              f"response_ids): {type(exc).__name__}: {exc}") from exc
    if not rows:
        raise CorpusError(f"{path}: no answers found (*.jsonl or *.jsonl.gz rows from `peagle-vllm distill`)")
    top = max(max(p + a, default=0) for p, a in rows)
    if vocab_size is not None and top >= vocab_size:
        raise CorpusError(f"{path}: token id {top} is outside the target's vocabulary of {vocab_size}: these answers "
                          "were written with another tokenizer; distill them with this target")
    return rows
