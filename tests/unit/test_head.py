"""The plain-torch head on tensors: one forward drafts K tokens, vocabulary maps, mask slots."""

from __future__ import annotations

import torch

from peagle_vllm.head import HeadConfig, PEagleHead


def make(variant: str = "standard", k: int = 8, vd: int = 40) -> PEagleHead:
    torch.manual_seed(0)
    cfg = HeadConfig(hidden_size=32, vocab_size=100, draft_vocab_size=vd, intermediate_size=64, num_attention_heads=2,
                     num_key_value_heads=2, aux_layer_ids=[1, 2, 3], mask_token_id=7, variant=variant, trained_depth=k,
                     fc_norm=variant == "depth", norm_output=variant == "depth")
    head = PEagleHead(cfg)
    with torch.no_grad():
        head.mask_hidden.normal_()
    if vd < 100:
        head.set_vocab_map(torch.arange(0, 2 * vd, 2))
    return head


def test_draft_block_is_one_forward_for_any_k() -> None:
    head = make("depth", k=32)
    calls = []
    head.register_forward_hook(lambda *a: calls.append(1))
    ctx_ids, ctx_aux = torch.randint(0, 100, (3, 5)), torch.randn(3, 5, 96)
    for k in (1, 8, 32):
        calls.clear()
        drafts = head.draft_block(torch.tensor([1, 2, 3]), torch.randn(3, 96), ctx_ids, ctx_aux, k)
        assert drafts.shape == (3, k) and len(calls) == 1


def test_drafts_live_in_the_draft_vocabulary_mapped_to_target_ids() -> None:
    head = make(vd=40)
    drafts = head.draft_block(torch.tensor([1]), torch.randn(1, 96), torch.randint(0, 100, (1, 4)),
                              torch.randn(1, 4, 96), 8)
    assert bool((drafts % 2 == 0).all()) and bool((drafts < 80).all())
    assert head.t2d.sum() == 40 and head.t2d[drafts].all()


def test_depth_variant_has_one_mask_state_per_depth_and_standard_shares_one() -> None:
    depth, standard = make("depth", k=8), make("standard", k=8)
    assert depth.mask_hidden.shape[0] == 7 and standard.mask_hidden.shape[0] == 1
    states = depth.mask_states(7)
    assert not torch.allclose(states[0], states[1])
    assert torch.equal(standard.mask_states(5)[0], standard.mask_states(5)[4])


def test_causal_default_matches_explicit_causal_mask() -> None:
    head = make()
    ids, hid = torch.randint(0, 100, (2, 6)), torch.randn(2, 6, 32)
    pos = torch.arange(6).expand(2, -1)
    causal = torch.ones(6, 6, dtype=torch.bool).tril().expand(2, -1, -1)
    assert torch.allclose(head(ids, hid, pos)[0], head(ids, hid, pos, causal)[0], atol=1e-5)
