"""Verification on vLLM 0.34 is vLLM's own rejection sampler (Triton kernels: GPU only), fed by the speculator:
drafts sampled from q = softmax(logits / T) and those logits left in vLLM's DraftLogitsCache, from which the
sampler rebuilds q. Checked here on CPU: that rebuilt q is exactly the q the drafts were drawn from, and drafts
made this way, verified by the same tests V2 runs (the core's `verify_standard` / `verify_block`: min(1, p/q)
and Sun et al.'s block rule), emit tokens distributed as the target's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", minversion="0.34", reason="the V2 adapter needs vLLM 0.34 or later")


def _rebuilt_q(values: torch.Tensor, slot: int, k: int, temperature: float) -> torch.Tensor:
    """What vLLM 0.34's rejection kernel computes from the cache: softmax(cached logits / T) per depth."""
    return (values[slot, :k].float() / temperature).softmax(-1)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.bfloat16])
def test_cached_logits_rebuild_exactly_the_draft_distribution(cache_dtype) -> None:
    from vllm.v1.worker.gpu.spec_decode.draft_logits import DraftLogitsCache

    from peagle_vllm.vllm_adapter.v2.drafts import cache_draft_logits, draft_block

    torch.manual_seed(0)
    b, k, vd, v = 3, 4, 40, 100
    d2t = torch.arange(0, 2 * vd, 2)  # draft id i is target id 2i
    logits = torch.randn(b, k, vd) * 3
    temperature = torch.tensor([0.0, 0.7, 1.3])
    cache = DraftLogitsCache(8, k, v, dtype=cache_dtype, fill=0.0, device="cpu")
    idx_mapping = torch.tensor([5, 2, 7])
    tokens, q, rounded = draft_block(logits, d2t, temperature, cache_dtype, v)
    cache_draft_logits(cache.values, idx_mapping, rounded, d2t)
    assert bool((tokens % 2 == 0).all()) and tokens.max() < 2 * vd  # drafts are target ids of the draft vocabulary
    assert torch.equal(tokens[0], d2t[rounded[0].float().argmax(-1)])  # greedy request: argmax
    for row, slot in ((1, 2), (2, 7)):
        torch.testing.assert_close(_rebuilt_q(cache.values, slot, k, float(temperature[row])), q[row],
                                   rtol=0, atol=1e-6)
    assert bool((cache.values[0] == 0).all())  # other request slots untouched


@pytest.mark.parametrize("mode", ["standard", "block"])
def test_drafts_and_cache_verify_losslessly(mode) -> None:
    from peagle_vllm.verify import verify_block, verify_standard
    from peagle_vllm.vllm_adapter.v2.drafts import cache_draft_logits, draft_block

    torch.manual_seed(1)
    n, k, v, temp = 40000, 3, 6, 0.9
    draft_logits = torch.randn(1, k, v).expand(n, -1, -1)
    target = torch.randn(k + 1, v)  # position-wise target logits (a target whose next token ignores the past)
    p = (target / temp).softmax(-1)
    tokens, _, rounded = draft_block(draft_logits, None, torch.full((n,), temp), torch.float32, v)
    values = torch.zeros(n, k, v)
    cache_draft_logits(values, torch.arange(n), rounded, None)
    q = (values / temp).softmax(-1)  # as vLLM rebuilds it
    bonus = torch.multinomial(p[k], n, replacement=True)
    verifier = verify_block if mode == "block" else verify_standard
    out = verifier(tokens, torch.full((n,), k), q, p[:k].expand(n, -1, -1), bonus)
    first = torch.bincount(out.tokens[:, 0], minlength=v).float() / n
    assert (first - p[0]).abs().max() < 0.015, (first, p[0])
    assert 0 < float(out.num_accepted.float().mean()) < k
