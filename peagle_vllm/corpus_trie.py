"""Corpus lookup for a whole batch on the device, in tensor ops only (no data read back to the host), for runners
whose drafts never pass a host-side scheduler (vLLM 0.34's V2 runner, `vllm_adapter/v2/speculator.py`).

`CorpusTrie.of(lookup)` turns a `corpus_lookup.CorpusLookup` index into a suffix trie and `continuation` walks it
for every request at once; the drafts are the ones `CorpusLookup.continuation` gives, request by request.

Rules:
- Level n holds the corpus's distinct n-token contexts (the n tokens before an answer token, nearest first). A node
  is keyed by (its parent's rank in level n-1, its token), and each level is sorted by key, so a request's context
  descends the trie with one binary search per level.
- A node of level >= min_n keeps its answer: the most frequent next token and its frequency, counted as
  `CorpusLookup` counts it (evenly spaced occurrences where a context has many).
- A node whose occurrences all have the same next token has no children: every longer context below it would give
  the same token at frequency 1. That keeps the trie near the index's size (SmolLM2's 6M-token corpus: 4.8M nodes,
  92 MiB, against 5.98M index rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from peagle_vllm.corpus_lookup import SAMPLED_AT_MOST, CorpusLookup


@dataclass(frozen=True)
class TrieLevel:
    """One context length's nodes, sorted by key."""

    keys: torch.Tensor  # [M] int64: parent's rank << bits | (token id + 1)
    next_tokens: torch.Tensor  # [M] int32: the most frequent next token (0 below min_n)
    frequency: torch.Tensor  # [M] float64: its share of the counted occurrences (0 below min_n)


class CorpusTrie:
    """`CorpusLookup`'s variable-order n-gram walk as tensors: build with `of`, move with `to`."""

    def __init__(self, levels: list[TrieLevel], bits: int, min_n: int, min_prob: float) -> None:
        self.levels, self.bits, self.min_n, self.min_prob = levels, bits, min_n, min_prob

    @property
    def max_n(self) -> int:
        """The longest context matched (the index's, or less where every longer one is pruned): the tokens
        `continuation` reads before each request's end."""
        return len(self.levels)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for level in self.levels for t in vars(level).values())

    def to(self, device: torch.device | str) -> CorpusTrie:
        levels = [TrieLevel(*(t.to(device) for t in vars(level).values())) for level in self.levels]
        return CorpusTrie(levels, self.bits, self.min_n, self.min_prob)

    @classmethod
    def of(cls, lookup: CorpusLookup) -> CorpusTrie:
        """The trie of `lookup`'s index (numpy on the host; SmolLM2's 6M-token corpus: ~4 s)."""
        follows = lookup.follows  # [N] the answer token after each index row (rows sorted by context)
        size = len(follows)
        starts_node = np.zeros(size, dtype=bool)  # [N] the row opens a node at this level
        starts_node[:1] = True
        inside = np.ones(size, dtype=bool)  # [N] the row's context is in the trie down to this level
        parent_rank = np.zeros(size, dtype=np.int64)  # [N] its node's rank one level up
        levels = []
        for n in range(1, lookup.max_n + 1):
            token = lookup.token_back(n).astype(np.int64)  # [N] id + 1; 0: before the answer's context
            starts_node[1:] |= token[1:] != token[:-1]
            inside &= token != 0  # no node has token 0, so a request's missing tokens (0) never match
            first = np.flatnonzero(starts_node)
            counts = np.diff(np.append(first, size))[inside[first]]  # [M] rows per node kept
            first = first[inside[first]]  # [M]
            rows = np.flatnonzero(inside)  # the kept nodes' rows, node after node
            if not len(first):
                break
            if n >= lookup.min_n:
                next_tokens, frequency = _most_frequent(follows, rows, first, counts)
            else:  # shorter contexts only lead to longer ones
                next_tokens, frequency = np.zeros(len(first), np.int32), np.zeros(len(first))
            keys = (parent_rank[first] << lookup.bits) | token[first]
            levels.append(TrieLevel(*map(torch.from_numpy, (keys, next_tokens, frequency))))
            node_of_row = np.repeat(np.arange(len(first)), counts)
            parent_rank[rows] = node_of_row
            if n >= lookup.min_n:  # a node whose occurrences all have one next token answers for all below it
                offsets = np.cumsum(counts) - counts
                low, high = (f.reduceat(follows[rows], offsets) for f in (np.minimum, np.maximum))
                inside[rows] &= (low != high)[node_of_row]
        return cls(levels, lookup.bits, lookup.min_n, lookup.min_prob)

    def continuation(self, tail: torch.Tensor,  # [B, max_n] each request's last tokens, nearest first; -1: none
                     k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(drafts [B, k] int64, found [B] int64): each request's up to k tokens walked from the corpus
        (`CorpusLookup.continuation`); the slots past `found` hold 0."""
        batch, device = tail.shape[0], tail.device
        context = tail.long() + 1  # [B, max_n] as the trie keys tokens; 0: no token
        drafts = torch.zeros(batch, k, dtype=torch.long, device=device)
        found = torch.zeros(batch, dtype=torch.long, device=device)
        going = torch.ones(batch, dtype=torch.bool, device=device)  # the walk goes on
        walked = torch.ones(batch, dtype=torch.float64, device=device)  # the product of the frequencies so far
        for depth in range(k):
            parent = torch.zeros(batch, dtype=torch.long, device=device)
            inside = torch.ones(batch, dtype=torch.bool, device=device)
            token = torch.zeros(batch, dtype=torch.long, device=device)  # the longest context's answer
            frequency = torch.zeros(batch, dtype=torch.float64, device=device)  # 0: none found
            for n, level in enumerate(self.levels, start=1):
                key = (parent << self.bits) | context[:, n - 1]
                at = torch.searchsorted(level.keys, key).clamp_(max=level.keys.shape[0] - 1)
                inside &= level.keys[at] == key
                parent = at
                if n >= self.min_n:
                    token = torch.where(inside, level.next_tokens[at], token)
                    frequency = torch.where(inside, level.frequency[at], frequency)
            walked = walked * frequency
            going &= (frequency > 0) & (walked >= self.min_prob)
            drafts[:, depth] = torch.where(going, token, 0)
            found += going
            context = torch.cat([(token + 1).unsqueeze(1), context[:, :-1]], dim=1)
        return drafts, found


def _most_frequent(follows: np.ndarray, rows: np.ndarray, first: np.ndarray,
                   counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(token [M] int32, frequency [M] float64) per node (rows `first[i]` to `first[i] + counts[i]` of the index):
    its most frequent next token, the smallest on a tie, counted over every occurrence, or over `CorpusLookup`'s
    evenly spaced sample of them where a node has 2 x SAMPLED_AT_MOST or more."""
    token, frequency = np.zeros(len(first), np.int32), np.zeros(len(first))
    small = counts < 2 * SAMPLED_AT_MOST
    node = np.repeat(np.arange(len(first)), counts)[np.repeat(small, counts)]  # small nodes' rows, in order
    if len(node):
        seen = follows[rows][np.repeat(small, counts)]
        order = np.lexsort((seen, node))
        node, seen = node[order], seen[order]
        run = np.flatnonzero(np.r_[True, (node[1:] != node[:-1]) | (seen[1:] != seen[:-1])])
        run_node, run_token, run_len = node[run], seen[run], np.diff(np.r_[run, len(node)])
        best = np.lexsort((run_token, -run_len, run_node))  # per node: the longest run first, then the smallest
        head = best[np.r_[True, run_node[best][1:] != run_node[best][:-1]]]
        token[run_node[head]], frequency[run_node[head]] = run_token[head], run_len[head] / counts[run_node[head]]
    for i in np.flatnonzero(~small):
        lo, hi = first[i], first[i] + counts[i]
        values, times = np.unique(follows[lo:hi:(hi - lo) // SAMPLED_AT_MOST], return_counts=True)
        top = int(times.argmax())
        token[i], frequency[i] = values[top], times[top] / times.sum()
    return token, frequency
