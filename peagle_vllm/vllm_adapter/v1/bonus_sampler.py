"""The sampler of the token after the drafts (and of every token while adaptive depth drafts none), on CPU:
vLLM's own Sampler, so every option, penalty, processor and logprobs mode is plain decoding's, with its last
step (top-k/top-p and the draw) made from each row's most likely tokens (`truncation`) instead of a sort of the
whole vocabulary. Rules: an unseeded row whose candidates hold every token top-k/top-p keeps draws among them
(`candidate_vocab.draw_kept`: the same distribution); a seeded row, any other row, and every row where the cut
logits are returned (processed logprobs modes) get the same mask over the whole vocabulary and vLLM's own draw,
so a seed draws the token plain decoding draws."""

from __future__ import annotations

import torch
from vllm.config.model import PROCESSED_LOGPROBS_MODES
from vllm.v1.sample.sampler import Sampler

from peagle_vllm import truncation
from peagle_vllm.candidate_vocab import draw_kept


class CandidateTopKTopP(torch.nn.Module):
    """vLLM's TopKTopPSampler (`inner`) for the rows the candidates do not serve, given logits already cut by
    top-k/top-p and no k or p of its own."""

    def __init__(self, inner: torch.nn.Module, candidates: int) -> None:
        super().__init__()
        self.inner, self.candidates = inner, candidates

    def forward(self, logits: torch.Tensor, generators: dict[int, torch.Generator], k: torch.Tensor | None,
                p: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """logits [B, V] float32 (temperature and min-p applied; edited in place, as vLLM's own sampler does);
        k, p [B] or None. Returns the tokens [B] and, in processed logprobs modes, the cut logits [B, V]."""
        if k is None and p is None:
            return self.inner(logits, generators, None, None)
        if self.inner.logprobs_mode in PROCESSED_LOGPROBS_MODES:
            return self._cut_and_draw(logits, generators, k, p)
        ids, kept, served = truncation.kept_candidates(logits, k, p, self.candidates)  # [B, C], [B, C], [B]
        if generators:
            served[list(generators)] = False
        noise = torch.float64 if self.inner.use_fp64_gumbel else torch.float32
        tokens = draw_kept(ids, kept, noise)
        rest = (~served).nonzero().squeeze(1)  # the host read
        if rest.numel():
            seeded = {j: generators[i] for j, i in enumerate(rest.tolist()) if i in generators}
            tokens[rest] = self._cut_and_draw(logits[rest], seeded, None if k is None else k[rest],
                                              None if p is None else p[rest])[0].long()
        return tokens, None

    def _cut_and_draw(self, logits: torch.Tensor, generators: dict[int, torch.Generator], k: torch.Tensor | None,
                      p: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """vLLM's draw over the whole vocabulary after the mask `truncation.by_candidates` makes. logits [N, V]."""
        logits.masked_fill_(truncation.by_candidates(logits, k, p, self.candidates), float("-inf"))
        return self.inner(logits, generators, None, None)


def with_candidate_top_p(sampler: Sampler, candidates: int) -> Sampler:
    """A new Sampler configured as `sampler` (left untouched) whose top-k/top-p uses `CandidateTopKTopP`."""
    bonus = Sampler(logprobs_mode=sampler.logprobs_mode, use_fp64_gumbel=sampler.use_fp64_gumbel)
    bonus.topk_topp_sampler = CandidateTopKTopP(bonus.topk_topp_sampler, candidates)
    return bonus
