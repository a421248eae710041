"""Corpus lookup for a whole batch on the device, in tensor ops only (no data read back to the host), for runners
whose drafts never pass a host-side scheduler (vLLM 0.34's V2 runner, `vllm_adapter/v2/speculator.py`).

`CorpusTable.of(lookup)` turns a `corpus_lookup.CorpusLookup` index into one sorted table of contexts, and
`continuation` walks it for every request at once; the drafts are the ones `CorpusLookup.continuation` gives,
request by request (up to 64-bit hash collisions, which only cost a draft: verification decides).

Rules:
- The table holds each distinct context of min_n to max_n tokens that occurs before an answer token, keyed by a
  hash of its tokens (a sum of each token times a fixed odd multiplier of its place, plus one of its length; int64
  arithmetic wraps), with its answer: the most frequent next token and its frequency, counted as `CorpusLookup`
  counts it (evenly spaced occurrences where a context has many).
- A draft is one search of all of a request's context lengths at once: the longest found answers. A context whose
  occurrences all have the same next token keeps no longer context in the table (each would give the same token at
  frequency 1), so the longest found is never longer than what `CorpusLookup` finds, and answers the same.
- Why a hash and not a trie descended level by level: a draft then takes about 38 tensor operations (views
  included) where the trie took about 107, and on a GPU each is a kernel launch. SmolLM2's 6M-token corpus: 4.3M
  contexts, 82 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from peagle_vllm.corpus_lookup import SAMPLED_AT_MOST, CorpusLookup

MAX_CONTEXT = 16  # the longest context a hash is defined for (CorpusLookup matches up to 8 tokens)
# [2, MAX_CONTEXT] int64: a multiplier per place in the context (nearest first), then a term per context length
MULTIPLIERS = torch.from_numpy(np.random.default_rng(2026).integers(-2**63, 2**63, (2, MAX_CONTEXT), np.int64) | 1)


def context_hashes(context: torch.Tensor,  # [B, n] token ids + 1, nearest first; 0 past the text
                   multipliers: torch.Tensor) -> torch.Tensor:  # [2, >= n] int64 (`MULTIPLIERS`) on its device
    """[B, n] int64: the hash of each row's first 1, 2, ..., n tokens (its context of that length)."""
    n = context.shape[1]
    return (context.long() * multipliers[0, :n]).cumsum(dim=1) + multipliers[1, :n]


@dataclass(frozen=True)
class CorpusTable:
    """`CorpusLookup`'s variable-order n-gram walk as tensors: build with `of`, move with `to`."""

    hashes: torch.Tensor  # [M] int64, sorted: each context's hash
    next_tokens: torch.Tensor  # [M] int32: its most frequent next token
    frequency: torch.Tensor  # [M] float64: that token's share of the occurrences counted
    multipliers: torch.Tensor  # [2, max_n] int64: `MULTIPLIERS` for the lengths matched, on the table's device
    min_n: int  # the shortest context matched
    max_n: int  # the longest: the tokens `continuation` reads before each request's end
    min_prob: float  # the walk stops where the product of its frequencies would fall below it

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.hashes, self.next_tokens, self.frequency))

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.hashes, self.next_tokens, self.frequency, self.multipliers

    def to(self, device: torch.device | str) -> CorpusTable:
        return self.with_tensors(*(t.to(device) for t in self.tensors))

    def with_tensors(self, *tensors: torch.Tensor) -> CorpusTable:
        """The same table over other tensors (e.g. fake ones): hashes, next_tokens, frequency, multipliers."""
        return CorpusTable(*tensors, self.min_n, self.max_n, self.min_prob)

    @classmethod
    def of(cls, lookup: CorpusLookup) -> CorpusTable:
        """The table of `lookup`'s index (numpy on the host; SmolLM2's 6M-token corpus: ~5 s)."""
        multipliers = MULTIPLIERS[:, :lookup.max_n].contiguous()
        follows = lookup.follows  # [N] the answer token after each index row (rows sorted by context)
        size = len(follows)
        starts_node = np.zeros(size, dtype=bool)  # [N] the row opens a distinct context of this length
        starts_node[:1] = True
        inside = np.ones(size, dtype=bool)  # [N] the row's context of this length is in the table
        hashes, next_tokens, frequency = [], [], []
        for n in range(1, lookup.max_n + 1):
            token = lookup.token_back(n).astype(np.int64)  # [N] id + 1; 0: before the answer's context
            starts_node[1:] |= token[1:] != token[:-1]
            inside &= token != 0  # a context reaching past an answer's context tail never matches a request's text
            if n < lookup.min_n:
                continue
            first = np.flatnonzero(starts_node)
            counts = np.diff(np.append(first, size))[inside[first]]  # [M] rows per context kept
            first = first[inside[first]]  # [M]
            if not len(first):
                break
            rows = np.flatnonzero(inside)  # the kept contexts' rows, one context after another
            answer = _most_frequent(lookup, rows, first, counts)
            context = np.stack([lookup.token_back(j, first) for j in range(1, n + 1)], axis=1)  # [M, n]
            hashes.append(context_hashes(torch.from_numpy(context.astype(np.int64)), multipliers)[:, -1])  # [M]
            next_tokens.append(torch.from_numpy(answer[0]))
            frequency.append(torch.from_numpy(answer[1]))
            low, high = (f.reduceat(follows[rows], np.cumsum(counts) - counts) for f in (np.minimum, np.maximum))
            inside[rows] &= np.repeat(low != high, counts)  # a context with one next token: none longer below it
        if not hashes:  # no context of min_n tokens or more
            return cls(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.int32),
                       torch.zeros(0, dtype=torch.float64), multipliers, lookup.min_n, lookup.max_n, lookup.min_prob)
        hashes, order = torch.cat(hashes).sort()
        unique = torch.ones_like(hashes, dtype=torch.bool)  # two contexts of one hash: both left out
        unique[1:] &= hashes[1:] != hashes[:-1]
        unique[:-1] &= hashes[1:] != hashes[:-1]
        keep = order[unique]
        return cls(hashes[unique], torch.cat(next_tokens)[keep], torch.cat(frequency)[keep], multipliers,
                   lookup.min_n, lookup.max_n, lookup.min_prob)

    def continuation(self, tail: torch.Tensor,  # [B, max_n] each request's last tokens, nearest first; -1: none
                     k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(drafts [B, k] int64, found [B] int64): each request's up to k tokens walked from the corpus
        (`CorpusLookup.continuation`); the slots past `found` hold 0."""
        batch, device = tail.shape[0], tail.device
        context = tail.long() + 1  # [B, max_n] ids + 1; 0: no token
        lengths = torch.arange(self.min_n, self.max_n + 1, device=device)  # [L] the context lengths matched
        drafts = torch.zeros(batch, k, dtype=torch.long, device=device)
        found = torch.zeros(batch, dtype=torch.long, device=device)
        going = torch.ones(batch, dtype=torch.bool, device=device)  # the walk goes on
        walked = torch.ones(batch, dtype=torch.float64, device=device)  # the product of the frequencies so far
        if self.hashes.shape[0] == 0:
            return drafts, found
        for depth in range(k):
            key = context_hashes(context, self.multipliers)[:, self.min_n - 1:].contiguous()  # [B, L]
            at = torch.searchsorted(self.hashes, key).clamp_(max=self.hashes.shape[0] - 1)  # [B, L]
            hit = (self.hashes[at] == key) & (context[:, self.min_n - 1:] > 0)  # [B, L]
            longest = at.gather(1, (hit * lengths).argmax(dim=1, keepdim=True)).squeeze(1)  # [B]
            frequency = torch.where(hit.any(dim=1), self.frequency[longest], 0.0)  # 0: none found
            walked = walked * frequency
            going &= (frequency > 0) & (walked >= self.min_prob)
            token = self.next_tokens[longest].long()
            drafts[:, depth] = torch.where(going, token, 0)
            found += going
            context = torch.cat([(token + 1).unsqueeze(1), context[:, :-1]], dim=1)
        return drafts, found


def _most_frequent(lookup: CorpusLookup, rows: np.ndarray, first: np.ndarray,
                   counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token [M] int32, frequency [M] float64) per context (rows `first[i]` to `first[i] + counts[i]` of the
    index): `lookup.most_frequent` of each, vectorized where it counts every row (fewer than 2 x SAMPLED_AT_MOST)."""
    follows = lookup.follows
    token, frequency = np.zeros(len(first), np.int32), np.zeros(len(first))
    small = counts < 2 * SAMPLED_AT_MOST
    counted = np.repeat(small, counts)  # the rows of contexts counted in full
    owner = np.repeat(np.arange(len(first)), counts)[counted]  # each such row's context
    if len(owner):
        seen = follows[rows][counted]
        order = np.lexsort((seen, owner))
        owner, seen = owner[order], seen[order]
        run = np.flatnonzero(np.r_[True, (owner[1:] != owner[:-1]) | (seen[1:] != seen[:-1])])
        run_owner, run_token, run_len = owner[run], seen[run], np.diff(np.r_[run, len(owner)])
        best = np.lexsort((run_token, -run_len, run_owner))  # per context: the longest run first, then the smallest
        head = best[np.r_[True, run_owner[best][1:] != run_owner[best][:-1]]]
        token[run_owner[head]], frequency[run_owner[head]] = run_token[head], run_len[head] / counts[run_owner[head]]
    for i in np.flatnonzero(~small):
        token[i], frequency[i] = lookup.most_frequent(first[i], first[i] + counts[i])
    return token, frequency
