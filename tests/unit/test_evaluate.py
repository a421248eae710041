"""The offline acceptance estimate on tensors: a draft counts while it and every shallower draft of its anchor
equal the target's argmax, over the anchors whose every depth lies inside the response."""

from __future__ import annotations

import torch

from peagle_vllm.head import HeadConfig, PEagleHead
from peagle_vllm.train.evaluate import acceptance_curve

K, T, VD = 4, 12, 16


def head_drafting_token_0() -> PEagleHead:
    """A head whose output layer is zero: every draft is draft token 0 (argmax of equal logits)."""
    torch.manual_seed(0)
    cfg = HeadConfig(hidden_size=32, vocab_size=VD, draft_vocab_size=VD, intermediate_size=64, num_attention_heads=2,
                     num_key_value_heads=2, aux_layer_ids=[1, 2, 3], mask_token_id=7, variant="depth", trained_depth=K,
                     fc_norm=True, norm_output=True)
    head = PEagleHead(cfg)
    with torch.no_grad():
        head.lm_head.weight.zero_()
    return head


def target_choosing(tokens: torch.Tensor) -> torch.Tensor:
    """[1, T, VD] logits whose argmax at position t is tokens[t]."""
    return torch.nn.functional.one_hot(tokens, VD).float().unsqueeze(0) * 10


def test_every_draft_right_accepts_every_depth_and_none_right_accepts_none() -> None:
    head = head_drafting_token_0()
    ids, aux, mask = torch.randint(0, VD, (1, T)), torch.randn(1, T, 96), torch.ones(1, T, dtype=torch.bool)
    right, wrong = torch.zeros(T, dtype=torch.long), torch.ones(T, dtype=torch.long)
    assert acceptance_curve(head, ids, aux, target_choosing(right), mask, K).tolist() == [1.0] * K
    assert acceptance_curve(head, ids, aux, target_choosing(wrong), mask, K).tolist() == [0.0] * K


def test_a_wrong_draft_ends_its_anchors_block() -> None:
    """The target picks token 0 except at position 6: every anchor whose block reaches position 6 stops there."""
    head = head_drafting_token_0()
    ids, aux, mask = torch.randint(0, VD, (1, T)), torch.randn(1, T, 96), torch.ones(1, T, dtype=torch.bool)
    choice = torch.zeros(T, dtype=torch.long)
    choice[6] = 1
    curve = acceptance_curve(head, ids, aux, target_choosing(choice), mask, K)
    assert torch.all(curve[1:] <= curve[:-1])  # a prefix rate never grows with depth
    assert 0 < curve[-1] < curve[0] < 1
