"""The rejection sampler's peak memory at vLLM's largest batch, K=32 drafts and Llama-3's vocabulary stays inside
what vLLM's profile run reserved for sampling; counted by `AllocCounter` on fake tensors (real shapes, no memory).

The budget, from vLLM 0.32's `GPUModelRunner.profile_run` -> `_dummy_sampler_run(last_hidden_states)`: for the
R = min(max_num_batched_tokens, max_num_seqs) dummy requests of `_dummy_run`, it samples [R, V] logits with
vLLM's Sampler; then, under speculative decoding, it draws `logits = torch.randn(2R, V)` in the model's dtype and
calls `self.rejection_sampler` (ours: `runner_hook.wrap_init` installs it) with `SpecDecodeMetadata.make_dummy`
of one draft per request, `draft_probs=None` (p_eagle keeps vLLM's default draft_sample_method "greedy") and its
dummy SamplingMetadata (temperature 0.5, top-k V-1, top-p 0.9, no generator), then again all-greedy. The peak of
that run is kept out of the KV cache, so the budget is the peak of the speculative part (its [2R, V] logits
included; the plain-sampler part before it, which could only raise the peak, is left out). A step at K drafts,
counted beyond its inputs (logits [B*(K+1), V] and draft_probs [B*K, V], made before the sampler runs), must stay
within it. R: vLLM's default max_num_seqs on GPUs (`EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`:
1024 with 70 GiB or more, else 256; max_num_batched_tokens is larger either way).

vLLM's CPU Sampler (the bonus token) calls two C++ kernels without a fake implementation; the fixture gives them
one (their output shape), for this module only. Seeded requests are left out: fake tensors cannot draw with a
torch.Generator.
"""

from __future__ import annotations

import contextlib
from dataclasses import replace

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from peagle_vllm.harness.alloc_counter import AllocCounter

K, V = 32, 128256  # drafts per request, Llama-3's vocabulary
GIB = 2**30


def test_the_counter_counts_every_new_storage_exactly_once_and_frees_it_at_the_next_op() -> None:
    for fake in (False, True):
        with FakeTensorMode() if fake else contextlib.nullcontext():
            x = torch.randn(100, 50)  # made outside the counter: never counted
            with AllocCounter() as c:
                same = x.float()  # already float32: x itself, nothing new
                y = x * 2  # 100 * 50 * 4 = 20000
                y.view(-1).add_(1)  # a view, in place: nothing new
                z = torch.empty(10, 10, dtype=torch.float64)  # 800
                del y  # freed: seen at the next op
                values, order = x.sort(-1)  # 20000 + 40000 (int64 indices): live 60800, the peak
                del values
                w = torch.ones(5, dtype=torch.int8)  # 5
        assert same is x and z.shape == (10, 10) and w.numel() == 5
        assert (c.peak, c.live) == (60800, 40805), f"fake={fake}"


@pytest.fixture(scope="module")
def sampler_parts():
    """vLLM's pieces the profile run and a step use, with fake kernels for the CPU Sampler's two C++ ops."""
    pytest.importorskip("vllm")
    import vllm._custom_ops  # noqa: F401  (loads the _C ops)
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata
    from vllm.v1.sample.sampler import Sampler
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    from peagle_vllm.vllm_adapter.v1.sampler import PEagleRejectionSampler

    lib = torch.library.Library("_C", "FRAGMENT")
    for op in ("_C::greedy_argmax", "_C::fused_gumbel_argmax"):  # -> token ids [N]
        torch.library.register_fake(op, lambda logits, *_: logits.new_empty(logits.shape[0], dtype=torch.long),
                                    lib=lib)

    def metadata(n: int, temperature: float | None, top_k: int | None, top_p: float) -> SamplingMetadata:
        """SamplingMetadata of n requests as `_dummy_sampler_run` builds it (temperature None: all greedy)."""
        full = lambda v: torch.full((n,), v)  # noqa: E731
        return SamplingMetadata(
            temperature=None if temperature is None else full(temperature), all_greedy=temperature is None,
            all_random=False, top_p=full(top_p), top_k=None if top_k is None else full(top_k), generators={},
            max_num_logprobs=None, logprob_token_ids=None, no_penalties=True, prompt_token_ids=None,
            frequency_penalties=full(0.1), presence_penalties=full(0.1), repetition_penalties=full(0.1),
            output_token_ids=[[] for _ in range(n)], spec_token_ids=[[] for _ in range(n)],
            allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors())

    def sampler(mode: str, max_rows: int):
        return PEagleRejectionSampler(Sampler(), None, "cpu", verify_mode=mode, max_rows=max_rows)

    yield metadata, sampler, SpecDecodeMetadata.make_dummy
    lib._destroy()


def _profile_peak(parts, mode: str, r: int) -> int:
    """Peak bytes of `_dummy_sampler_run`'s speculative part, on fake tensors, its logits included."""
    metadata, sampler, make_dummy = parts
    with FakeTensorMode():
        rejection_sampler = sampler(mode, max_rows=r)  # what `runner_hook.wrap_init` passes: R
        with AllocCounter() as counter:
            spec = make_dummy([[0] for _ in range(r)], torch.device("cpu"))
            logits = torch.randn(2 * r, V, dtype=torch.bfloat16)
            dummy = metadata(r, 0.5, V - 1, 0.9)
            rejection_sampler(spec, None, logits, dummy)
            rejection_sampler(spec, None, logits, replace(dummy, temperature=None, all_greedy=True))
    return counter.peak


def _step_peak(parts, mode: str, b: int, max_rows: int, draft_probs: bool, top_k: int | None) -> int:
    """Peak bytes of one step: b sampled requests (temperature 0.7, top-p 0.9), K drafts each, beyond its inputs."""
    metadata, sampler, make_dummy = parts
    with FakeTensorMode():
        rejection_sampler = sampler(mode, max_rows)
        spec = make_dummy([list(range(K)) for _ in range(b)], torch.device("cpu"))
        logits = torch.empty(b * (K + 1), V, dtype=torch.bfloat16)  # [B*(K+1), V] from the runner
        q = torch.empty(b * K, V) if draft_probs else None  # [B*K, V] from the drafter (sampled drafts)
        sampling = metadata(b, 0.7, top_k, 0.9)
        with AllocCounter() as counter:
            out = rejection_sampler(spec, q, logits, sampling)
        assert out.sampled_token_ids.shape == (b, K + 1)
    return counter.peak


@pytest.mark.parametrize("r", [256, 1024])
@pytest.mark.parametrize("mode", ["auto", "block"])
@pytest.mark.parametrize("draft_probs,top_k", [(True, None), (False, 50)], ids=["draft-probs", "one-hot+top-k"])
def test_a_step_at_max_num_seqs_and_k32_stays_within_the_profiled_budget(sampler_parts, r, mode, draft_probs,
                                                                          top_k) -> None:
    budget = _profile_peak(sampler_parts, mode, r)
    peak = _step_peak(sampler_parts, mode, r, r, draft_probs, top_k)
    assert peak <= budget, f"R={r} K={K}: step {peak / GIB:.2f} GiB > profiled {budget / GIB:.2f} GiB"
    assert peak >= 8 * r * V, "the count covers at least one chunk's float32 logits and distributions [R, V]"


def test_the_budget_catches_a_step_processing_every_draft_row_at_once(sampler_parts) -> None:
    r = 256
    budget = _profile_peak(sampler_parts, "auto", r)
    assert _step_peak(sampler_parts, "auto", r, r * K, True, None) > 8 * budget
