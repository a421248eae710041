"""The q of each scheduled draft (`scheduled_q`): the head's where it drafted, one-hot where a lookup did or past the
head's depth; and verification with that q keeps the target's distribution when a lookup drafts."""

from __future__ import annotations

import torch

from peagle_vllm.scheduled_q import lookup_rows, scheduled_draft_probs
from peagle_vllm.verify import verify_block, verify_standard


def test_lookup_rows_are_the_lookups_positions_and_those_past_the_heads_depth() -> None:
    # a head depth of 2; request 0: 3 drafts, a lookup at 1; request 1: 5 drafts, a lookup at 0; request 2: 2, none
    assert lookup_rows([3, 5, 2], [(1,), (0,), ()], head_depth=2) == [1, 2, 3, 5, 6, 7]
    assert lookup_rows([2], [(0, 4)], head_depth=4) == [0]  # a position past what was scheduled is dropped


def test_rows_follow_the_verified_drafts_not_the_heads_layout() -> None:
    b, k, v = 3, 2, 6
    head_q = torch.rand(b, k, v).softmax(-1)
    # requests verified in another order than the head drafted them; the second has 4 drafts, 2 past the head
    head_rows, num_draft, positions = [2, 0], [1, 4], [(), (1,)]
    draft_ids = torch.tensor([5, 1, 2, 3, 4])
    q = scheduled_draft_probs(head_q, head_rows, num_draft, positions, draft_ids)
    assert q.shape == (5, v)
    assert torch.equal(q[0], head_q[2, 0]) and torch.equal(q[1], head_q[0, 0])
    for row, token in ((2, 2), (3, 3), (4, 4)):  # the lookup at position 1, then positions 2 and 3
        assert torch.equal(q[row], torch.nn.functional.one_hot(torch.tensor(token), v).float())


def _first_tokens(verifier, draft_token: int, q: torch.Tensor, p: torch.Tensor, n: int) -> torch.Tensor:
    """The first emitted token of n verifications of one draft `draft_token` with draft distribution q [V]
    against target p [V]."""
    drafts = torch.full((n, 1), draft_token)
    probs = p.expand(n, 1, -1).contiguous()
    out = verifier(drafts, torch.ones(n, dtype=torch.long), q.expand(n, 1, -1).contiguous(), probs,
                   torch.zeros(n, dtype=torch.long))
    return out.tokens[:, 0]


def test_a_lookup_draft_verified_with_its_one_hot_q_keeps_the_target_distribution() -> None:
    """A lookup's draft is no sample of the head's q: verified with that q it is over-accepted (the target's
    distribution is lost); with its one-hot q, as `scheduled_draft_probs` lays it out, it is not."""
    torch.manual_seed(0)
    v, n = 5, 40_000
    p = torch.tensor([0.1, 0.2, 0.3, 0.15, 0.25])
    head_q = torch.tensor([[[0.6, 0.1, 0.1, 0.1, 0.1]]])  # the head favours token 0; the lookup drafts token 3
    one_hot = scheduled_draft_probs(head_q, [0], [1], [(0,)], torch.tensor([3]))[0]
    for verifier in (verify_standard, verify_block):
        right = torch.bincount(_first_tokens(verifier, 3, one_hot, p, n), minlength=v).float() / n
        assert (right - p).abs().max() < 0.01, right
        wrong = torch.bincount(_first_tokens(verifier, 3, head_q[0, 0], p, n), minlength=v).float() / n
        assert wrong[3] > p[3] + 0.3, wrong  # accepted whenever u * 0.1 <= 0.15
