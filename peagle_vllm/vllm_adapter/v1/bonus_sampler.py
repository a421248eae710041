"""The sampler of the token after the drafts (and of every token while adaptive depth drafts none), on CPU:
vLLM's own Sampler, so every option, seed and logprobs mode is plain decoding's, with top-k/top-p decided
from each row's most likely tokens (`truncation.by_candidates`) before vLLM's top-k/top-p sampler runs, in
place of that sampler's sort of the whole vocabulary. The mask is the same, so a seed draws the same token."""

from __future__ import annotations

import torch
from vllm.v1.sample.sampler import Sampler

from peagle_vllm import truncation


class CandidateTopKTopP(torch.nn.Module):
    """vLLM's TopKTopPSampler (`inner`) given logits already cut by top-k/top-p, and no k or p of its own."""

    def __init__(self, inner: torch.nn.Module, candidates: int) -> None:
        super().__init__()
        self.inner, self.candidates = inner, candidates

    def forward(self, logits: torch.Tensor, generators: dict[int, torch.Generator], k: torch.Tensor | None,
                p: torch.Tensor | None):
        """logits [B, V] float32 (temperature and min-p applied, edited in place as vLLM's own does); k, p [B]."""
        if k is not None or p is not None:
            logits.masked_fill_(truncation.by_candidates(logits, k, p, self.candidates), float("-inf"))
        return self.inner(logits, generators, None, None)


def with_candidate_top_p(sampler: Sampler, candidates: int) -> Sampler:
    """A new Sampler configured as `sampler` (left untouched) whose top-k/top-p uses `CandidateTopKTopP`."""
    bonus = Sampler(logprobs_mode=sampler.logprobs_mode, use_fp64_gumbel=sampler.use_fp64_gumbel)
    bonus.topk_topp_sampler = CandidateTopKTopP(bonus.topk_topp_sampler, candidates)
    return bonus
