"""From the head's K output rows per request to drafts that vLLM 0.34's rejection sampler verifies losslessly.

Rules:
- Greedy requests (temperature 0) draft the argmax; sampled ones draw from q = softmax(logits / T) with the
  core's `peagle_vllm.proposer.sample_drafts` (plain torch).
- vLLM 0.34 verifies a sampled draft x with p(x) > u * q(x), rebuilding q from the pre-temperature draft
  logits the speculator leaves in `DraftLogitsCache.values[request slot, depth, :]` (target vocabulary, -inf
  outside the draft vocabulary). So the logits are rounded to the cache's dtype BEFORE sampling: the q the
  draft was drawn from and the q the verifier rebuilds are the same numbers.
- A head that emits NaN/Inf must not change outputs: such rows become uniform over the draft vocabulary
  (verification then accepts or rejects them losslessly like any other draft) and are counted.
- Draft noise comes from torch's generator, not from the request's seed: outputs stay exact in distribution,
  but a seeded request's drafts (and so its sampled output) do not repeat run to run. vLLM's own seeded draft
  sampler (`gumbel_sample`) is a Triton kernel keyed by (seed, position); using it would tie drafts to Triton.
"""

from __future__ import annotations

import torch

from peagle_vllm.proposer import sample_drafts


def sanitize(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, K, Vd] -> (logits with non-finite rows set to 0, i.e. uniform; number of such rows [])."""
    bad = ~torch.isfinite(logits).all(dim=-1, keepdim=True)
    return logits.masked_fill(bad, 0.0), bad.sum()


def draft_block(logits: torch.Tensor, draft_to_target: torch.Tensor | None, temperature: torch.Tensor,
                cache_dtype: torch.dtype, target_vocab: int) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """logits [B, K, Vd] (draft vocabulary), temperature [B] -> (drafts [B, K] target ids, q [B, K, V] or None
    when every request is greedy, the rounded draft logits [B, K, Vd] to cache)."""
    rounded = logits.to(cache_dtype)
    # vLLM 0.34's V2 runner has no host-side all-greedy flag: one read here spares an all-greedy batch q [B, K, V]
    sampled = temperature if bool((temperature > 0).any()) else None
    drafts, q = sample_drafts(rounded.float(), draft_to_target, sampled, None, target_vocab)
    return drafts, q, rounded


def cache_draft_logits(values: torch.Tensor, idx_mapping: torch.Tensor, rounded: torch.Tensor,
                       draft_to_target: torch.Tensor | None) -> None:
    """Writes rounded draft logits [B, K, Vd] into the cache values [max_reqs, K_max, V] at each request's slot
    idx_mapping [B] (real requests only: dummy runs do not cache), mapped to the target vocabulary (-inf
    outside the draft vocabulary)."""
    b, k, _ = rounded.shape
    if draft_to_target is None:
        full = rounded
    else:
        full = rounded.new_full((b, k, values.shape[-1]), float("-inf"))
        full[..., draft_to_target] = rounded
    values[idx_mapping.long(), :k] = full.to(values.dtype)
