"""pytest-benchmark: our rejection sampler vs vLLM's own on identical inputs (B x K, greedy and
sampled), run on demand: `pytest -m benchmark_only tests/bench --benchmark-group-by=param`."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.benchmark_only
V = 4096


def _inputs(batch: int, k: int, greedy: bool):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    torch.manual_seed(0)
    logits = torch.randn(batch * (k + 1), V)
    drafts = [logits.view(batch, k + 1, V)[b, :k].argmax(-1).tolist() for b in range(batch)]
    meta = SpecDecodeMetadata.make_dummy(drafts, torch.device("cpu"))
    sm = SamplingMetadata(
        temperature=None if greedy else torch.ones(batch), all_greedy=greedy, all_random=not greedy, top_p=None,
        top_k=None, generators={}, max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())
    q = None if greedy else torch.softmax(torch.randn(batch * k, V), -1)
    return meta, q, logits, sm


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
@pytest.mark.parametrize("k", [8, 32])
@pytest.mark.parametrize("batch", [1, 16, 64, 256])
@pytest.mark.parametrize("impl", ["ours", "vllm"])
def test_rejection_sampler_time(benchmark, impl: str, batch: int, k: int, greedy: bool) -> None:
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    from peagle_vllm.vllm_adapter.v1.sampler import PEagleRejectionSampler

    from vllm.platforms import current_platform

    if hasattr(current_platform, "register_triton_kernel_overrides"):
        current_platform.register_triton_kernel_overrides()  # vLLM's C++ kernels on CPU, as its engine does
    torch.set_num_threads(1)
    sampler = PEagleRejectionSampler(Sampler(), None, "cpu") if impl == "ours" else RejectionSampler(Sampler())
    meta, q, logits, sm = _inputs(batch, k, greedy)
    benchmark.group = f"B={batch} K={k} {'greedy' if greedy else 'sampled'}"
    out = benchmark(lambda: sampler(meta, q, logits.clone(), sm))
    assert out.sampled_token_ids.shape == (batch, k + 1)
