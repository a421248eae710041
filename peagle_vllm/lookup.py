"""Prompt lookup beside the head: where a request's tokens so far end in an n-gram that occurred earlier in
them (prompt or output), the tokens that followed its latest earlier occurrence are drafted in place of the head's
drafts at those depths (`chain`).

Rules:
- The longest suffix n-gram with `min_n <= n <= max_n` wins; among its occurrences, the latest (nearest text).
- Output stays the target's: a greedy request's drafts are checked against the target's argmax whatever drafted
  them; a sampled request verifies a lookup's draft with a one-hot draft distribution (`scheduled_q`).
- P-EAGLE's head drafts every depth from the context and mask slots, never from its own earlier drafts, so its
  depth-d draft stays a draft for position d whatever drafts fill the depths before it; and a lookup drafts from
  any text, so it looks up again past each of the head's drafts.
No vLLM here: the scheduler hook (`vllm_adapter/v1/scheduler_hook.py`) applies it to each step's drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

DEFAULT_MIN_N, DEFAULT_MAX_N = 2, 5  # n-gram lengths matched (held-out measurement: docs/smollm2-results.md)


@dataclass(frozen=True)
class PromptLookup:
    """Suffix n-gram lookup over a request's own tokens; n from `min_n` to `max_n` (1 <= min_n <= max_n)."""

    min_n: int = DEFAULT_MIN_N
    max_n: int = DEFAULT_MAX_N

    def continuation(self, tokens: np.ndarray, k: int) -> np.ndarray:
        """tokens [L] (prompt and output so far) -> up to k tokens [<= k] that followed the latest earlier
        occurrence of the longest suffix n-gram of `tokens` (min_n <= n <= max_n); empty where none occurred."""
        size = len(tokens)
        if k <= 0 or size <= self.min_n:
            return tokens[:0]
        # ends [M]: positions i < L-1 where an earlier occurrence of the suffix's last n tokens ends
        ends = np.flatnonzero(tokens[: size - 1] == tokens[size - 1])
        found = ends if self.min_n == 1 else ends[:0]
        for n in range(2, self.max_n + 1):
            ends = ends[ends >= n - 1]
            if not len(ends):
                break
            ends = ends[tokens[ends - (n - 1)] == tokens[size - n]]
            if not len(ends):
                break
            if n >= self.min_n:
                found = ends
        if not len(found):
            return tokens[:0]
        start = int(found[-1]) + 1
        return tokens[start: start + k]


class TokenHistory:
    """Each request's tokens so far (prompt and output) as one growing array, extended each step by the tokens
    appended since: a step copies those, not the whole text (some 250 us a request at 8k tokens)."""

    def __init__(self) -> None:
        self._arrays: dict[str, tuple[np.ndarray, int]] = {}  # request -> (buffer [capacity], tokens held)

    def of(self, req_id: str, tokens) -> np.ndarray:
        """tokens (a sequence that only grows, e.g. vLLM's `Request.all_token_ids`) -> the same as an array [L]."""
        size = len(tokens)
        buffer, held = self._arrays.get(req_id, (None, 0))
        if buffer is None or held > size:  # (a text that shrank is taken anew)
            buffer, held = np.empty(max(2 * size, 64), dtype=np.int64), 0
        elif size > len(buffer):
            buffer = np.concatenate([buffer[:held], np.empty(2 * size - held, dtype=np.int64)])
        if size > held:
            buffer[held:size] = tokens[held:size]
        self._arrays[req_id] = (buffer, size)
        return buffer[:size]

    def forget(self, req_id: str) -> None:
        self._arrays.pop(req_id, None)


@dataclass(frozen=True)
class FirstFound:
    """Lookups tried in turn (e.g. the request's own text, then a corpus): the first continuation found wins."""

    lookups: tuple  # each with continuation(tokens [L], k) -> [<= k]

    def continuation(self, tokens: np.ndarray, k: int) -> np.ndarray:
        for lookup in self.lookups:
            found = lookup.continuation(tokens, k)
            if len(found):
                return found
        return tokens[:0]


def chain(lookup, text: np.ndarray, head_drafts: list[int], k: int) -> tuple[list[int], list[bool]]:
    """(drafts [<= k], whether each came from the lookup): depth by depth, the lookup's continuation of the text
    [L] and the drafts so far where it finds one, else the head's draft at that depth [K_head]. The drafts end at
    k, or at the first depth past the head's where the lookup finds none."""
    drafts, by_lookup = [], []
    while len(drafts) < k:
        found = lookup.continuation(np.concatenate((text, np.asarray(drafts, dtype=text.dtype))) if drafts else text,
                                    k - len(drafts))
        if len(found):
            drafts += found.tolist()
            by_lookup += [True] * len(found)
        elif len(drafts) < len(head_drafts):
            drafts.append(head_drafts[len(drafts)])
            by_lookup.append(False)
        else:
            break
    return drafts, by_lookup
