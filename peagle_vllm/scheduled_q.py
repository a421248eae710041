"""The draft distribution q of each scheduled draft: the head's where the head drafted the token, one-hot where a
lookup did.

Rules (what keeps sampled requests lossless when lookups draft beside the head):
- A lookup's draft is a function of the text before it, so its q is one-hot: verification accepts it with the
  target's probability p(x) and, on a rejection, draws from p with x removed.
- The head's depth-d draft was sampled from its q at depth d, whatever drafts fill the depths before it (P-EAGLE
  drafts every depth from the context and mask slots), so that q stays its own.
- A request may verify more drafts than the head drafted (lookups past the head's depth): those are lookups'.
No vLLM here: the V1 runner hook builds vLLM's flat draft_probs with it.
"""

from __future__ import annotations

import torch


def lookup_rows(num_draft: list[int], lookup_positions: list[tuple[int, ...]], head_depth: int) -> list[int]:
    """Flat indices of the draft rows whose q is one-hot: per request (num_draft[i] drafts laid end to end), the
    positions a lookup drafted and every position at or past the head's depth."""
    rows, start = [], 0
    for n, given in zip(num_draft, lookup_positions):
        rows += sorted({start + p for p in given if p < n} | set(range(start + head_depth, start + n)))
        start += n
    return rows


def scheduled_draft_probs(head_q: torch.Tensor, head_rows: list[int], num_draft: list[int],
                          lookup_positions: list[tuple[int, ...]], draft_ids: torch.Tensor) -> torch.Tensor:
    """head_q [B, k, V]: the head's q per drafting request and depth; head_rows [R], num_draft [R]: each
    verifying request's row in head_q and its scheduled drafts (R requests, num_draft > 0); lookup_positions [R]:
    the positions a lookup drafted; draft_ids [N] (N = sum(num_draft)): the scheduled drafts, flat.
    -> q [N, V] of every scheduled draft, one-hot at the lookups' (`lookup_rows`). Reads nothing back to the host."""
    k, vocab = head_q.shape[1], head_q.shape[2]
    parts = []
    for row, n in zip(head_rows, num_draft):
        parts.append(head_q[row, :min(n, k)])
        if n > k:
            parts.append(head_q.new_zeros(n - k, vocab))
    q = torch.cat(parts)
    one_hot = lookup_rows(num_draft, lookup_positions, k)
    if one_hot:
        at = torch.tensor(one_hot, dtype=torch.long).to(q.device, non_blocking=True)
        q[at] = 0
        q[at, draft_ids[at].long().clamp_min(0)] = 1
    return q
