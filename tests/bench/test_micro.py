"""Micro-benchmarks (on demand: `pytest -m benchmark_only tests/bench`): the head's draft cost vs K
(one forward whatever K), and the verifier's cost at B x K."""

from __future__ import annotations

import pytest
import torch

from peagle_vllm.head import HeadConfig, PEagleHead
from peagle_vllm.verify import target_probs, verify

pytestmark = pytest.mark.benchmark_only


def demo_sized_head(k: int = 32) -> PEagleHead:
    cfg = HeadConfig(hidden_size=256, vocab_size=4096, draft_vocab_size=2048, intermediate_size=1024,
                     num_attention_heads=4, num_key_value_heads=4, aux_layer_ids=[1, 2, 3], mask_token_id=1,
                     variant="depth", trained_depth=k, fc_norm=True, norm_output=True)
    return PEagleHead(cfg).eval()


@pytest.mark.parametrize("batch", [1, 16])
@pytest.mark.parametrize("k", [1, 2, 4, 8, 16, 32])
def test_head_draft_block_time_vs_k(benchmark, k: int, batch: int) -> None:
    torch.set_num_threads(1)
    head = demo_sized_head()
    ctx = 8  # decode step: the accepted tokens of the last step, then K-1 mask slots
    args = (torch.randint(0, 4096, (batch,)), torch.randn(batch, 768), torch.randint(0, 4096, (batch, ctx)),
            torch.randn(batch, ctx, 768), k)
    benchmark.extra_info.update(k=k, batch=batch)
    drafts = benchmark(head.draft_block, *args)
    assert drafts.shape == (batch, k)


@pytest.mark.parametrize("mode", ["greedy", "standard", "block"])
@pytest.mark.parametrize("batch,k", [(1, 8), (16, 8), (64, 8), (1, 32), (16, 32), (64, 32)])
def test_verify_time(benchmark, mode: str, batch: int, k: int) -> None:
    torch.set_num_threads(1)
    v = 4096
    logits = torch.randn(batch * k, v)
    probs = target_probs(logits, torch.ones(batch * k)).view(batch, k, v)
    argmax = logits.argmax(-1).view(batch, k)
    drafts = argmax.clone()
    q = torch.softmax(torch.randn(batch, k, v), -1) if mode != "greedy" else None
    greedy = torch.full((batch,), mode == "greedy")
    probs = None if mode == "greedy" else probs  # an all-greedy batch has no sampling distribution (vLLM's all_greedy)
    benchmark(verify, mode, drafts, torch.full((batch,), k), q, probs, argmax, torch.zeros(batch, dtype=torch.long), greedy)
