"""What becomes of KV-cache slots after a partial acceptance (plain integers and tensors, no vLLM).

After verification a request's KV is valid only below its committed length (`num_computed`, the
tokens whose KV the target wrote and kept). Everything at or beyond it (rejected drafts, the draft
head's mask slots) is stale: it must never be read again and is overwritten by the next step,
which writes before it reads. The blocks a request holds beyond what its next step needs
(committed tokens + 1 bonus + its drafts + the draft head's lookahead for its own K) go back to
the pool at once instead of when the request ends.
"""

from __future__ import annotations

import torch


def blocks_for(num_tokens: int, block_size: int) -> int:
    """Blocks that hold `num_tokens` slots."""
    return -(-num_tokens // block_size)


def next_step_tokens(num_computed: int, num_drafts: int, lookahead: int) -> int:
    """Slots a request needs next step: committed + 1 bonus/input token + drafts to verify + the
    positions the draft head writes past them (its mask slots)."""
    return num_computed + 1 + num_drafts + lookahead


def beyond_capacity(positions: torch.Tensor, tokens_per_request: torch.Tensor, capacity: torch.Tensor) -> torch.Tensor:
    """[num_tokens] bool: token t of a flattened batch sits at a position its request holds no slot
    for (requests laid out back to back, `tokens_per_request[r]` tokens each; `capacity[r]` slots).
    Such draft-head writes must be dropped: the block table past a request's blocks is not its own.
    positions [num_tokens], tokens_per_request [B] and capacity [B] on one device: nothing is copied."""
    owner = torch.repeat_interleave(torch.arange(len(capacity), device=positions.device), tokens_per_request,
                                    output_size=positions.numel())
    return positions >= capacity[owner]


def stale_slots(block_ids: list[int], start: int, block_size: int) -> torch.Tensor:
    """Cache slots of one request at positions >= start within the blocks it holds. With start =
    the committed length: what a rejected draft or a mask slot may have written, and no later step
    may read."""
    capacity = len(block_ids) * block_size
    if start >= capacity:
        return torch.empty(0, dtype=torch.long)
    positions = torch.arange(max(start, 0), capacity)
    blocks = torch.tensor(block_ids, dtype=torch.long)[positions // block_size]
    return blocks * block_size + positions % block_size
