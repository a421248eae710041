"""What becomes of KV slots after a partial acceptance (`peagle_vllm.rollback`): plain integers and tensors."""

from __future__ import annotations

import torch

from peagle_vllm.rollback import beyond_capacity, blocks_for, next_step_tokens, stale_slots


def test_blocks_for_rounds_up_to_whole_blocks() -> None:
    assert [blocks_for(n, 16) for n in (0, 1, 15, 16, 17, 32, 33)] == [0, 1, 1, 1, 2, 2, 3]
    assert blocks_for(5, 1) == 5


def test_next_step_needs_the_committed_tokens_a_bonus_token_the_drafts_and_the_heads_lookahead() -> None:
    assert next_step_tokens(num_computed=100, num_drafts=4, lookahead=8) == 113
    assert next_step_tokens(num_computed=100, num_drafts=0, lookahead=0) == 101, "plain decoding: one token"
    assert blocks_for(next_step_tokens(31, 0, 0), 16) == 2, "the bonus token may need a block of its own"


def test_stale_slots_are_the_held_slots_at_and_beyond_the_committed_length() -> None:
    # blocks 7 then 3 of size 4: positions 0-3 are slots 28-31, positions 4-7 slots 12-15
    assert stale_slots([7, 3], start=5, block_size=4).tolist() == [13, 14, 15]
    assert stale_slots([7, 3], start=2, block_size=4).tolist() == [30, 31, 12, 13, 14, 15]
    assert stale_slots([7, 3], start=0, block_size=4).tolist() == [28, 29, 30, 31, 12, 13, 14, 15]
    assert stale_slots([7, 3], start=-3, block_size=4).tolist() == [28, 29, 30, 31, 12, 13, 14, 15]


def test_no_slot_is_stale_at_or_beyond_the_capacity_held() -> None:
    for start in (8, 9, 100):
        slots = stale_slots([7, 3], start=start, block_size=4)
        assert slots.numel() == 0 and slots.dtype == torch.long
    assert stale_slots([], start=0, block_size=4).numel() == 0


def test_beyond_capacity_marks_each_token_past_its_own_requests_slots() -> None:
    # three requests back to back: 3 tokens (capacity 10), none (capacity 0), 4 tokens (capacity 6)
    positions = torch.tensor([8, 9, 10, 4, 5, 6, 7])
    out = beyond_capacity(positions, torch.tensor([3, 0, 4]), torch.tensor([10, 0, 6]))
    assert out.dtype == torch.bool
    assert out.tolist() == [False, False, True, False, False, True, True]


def test_beyond_capacity_of_an_empty_batch_is_empty() -> None:
    out = beyond_capacity(torch.tensor([], dtype=torch.long), torch.tensor([0, 0]), torch.tensor([4, 4]))
    assert out.shape == (0,)
