"""From the head's K output rows per request to drafts that vLLM 0.34's rejection sampler verifies losslessly.

Rules:
- vLLM 0.34 verifies a sampled draft x with p(x) > u * q(x), rebuilding q = softmax(logits / T) in float32 from
  the pre-temperature draft logits the speculator leaves in `DraftLogitsCache.values[request slot, depth, :]`
  (target vocabulary, -inf outside the draft vocabulary). So the logits are rounded to the cache's dtype BEFORE
  drafting, and sampled drafts are drawn from softmax(rounded.float() / T) over the draft vocabulary: the q the
  draft was drawn from and the q the verifier rebuilds are the same numbers (the -inf entries add nothing).
- Sampled drafts follow the request's top-k/top-p (vLLM's order: temperature, then top-k, then top-p over what
  top-k kept), applied to q over the draft vocabulary: the tokens they remove get -inf logits before the draw
  and in the cache, so the verifier's q is the truncated q the draft was drawn from.
- A draft a lookup gave (prompt lookup, `batch_lookup`) is a function of the text before it, so its q is one-hot:
  its cached row is 0 at the drafted token and -inf elsewhere, which the verifier rebuilds as that point mass
  (accept with p(x); on a rejection draw from p without x), at any temperature.
- Greedy requests (temperature 0) draft the argmax. Every row is drawn and argmaxed, and the two are chosen per
  request on the device: the V2 runner has no host-side all-greedy flag, and reading one from the device would
  sync every step. Nothing here builds q over the target vocabulary (the verifier does, from the cache).
- A head that emits NaN/Inf (or logits the cache's dtype cannot hold) must not change outputs: such rows
  become uniform over the draft vocabulary (verification then accepts or rejects them losslessly like any other
  draft) and are counted.
- Draft noise comes from torch's generator, not from the request's seed: outputs stay exact in distribution,
  but a seeded request's drafts (and so its sampled output) do not repeat run to run. vLLM's own seeded draft
  sampler (`gumbel_sample`) is a Triton kernel keyed by (seed, position); using it would tie drafts to Triton.
"""

from __future__ import annotations

import torch

from peagle_vllm.truncation import by_sorting
from peagle_vllm.verify import sample_rows


def sanitize(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [B, K, Vd] -> (logits with non-finite rows set to 0, i.e. uniform; number of such rows [])."""
    bad = ~torch.isfinite(logits).all(dim=-1, keepdim=True)
    return logits.masked_fill(bad, 0.0), bad.sum()


def draft_probs(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits [B, K, Vd], temperature [B] -> q [B, K, Vd] = softmax(logits.float() / T), as vLLM's rejection kernel
    computes it from the cached logits (T <= 0, a greedy request, reads as 1: its q is never used)."""
    t = torch.where(temperature > 0, temperature, 1.0).float().view(-1, 1, 1)
    return (logits.float() / t).softmax(-1)


def draw(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits [B, K, Vd], temperature [B] -> draft-vocabulary ids [B, K]: the argmax where T <= 0, else one exact
    draw from `draft_probs` (the core's inverse-transform draw, `sample_rows`, as `proposer.sample_drafts` draws)."""
    b, k, vd = logits.shape
    sampled = sample_rows(draft_probs(logits, temperature).view(b * k, vd)).view(b, k)
    return torch.where((temperature <= 0).view(b, 1), logits.argmax(-1), sampled)


def truncate(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None,
             top_p: torch.Tensor | None) -> torch.Tensor:
    """logits [B, K, Vd], temperature/top_k/top_p [B] -> logits with -inf where the request's top-k/top-p remove
    the token from softmax(logits / T); greedy rows (T <= 0) unchanged. Sorts; reads nothing back to the host."""
    b, k, vd = logits.shape
    t = torch.where(temperature > 0, temperature, 1.0).float().view(-1, 1, 1)
    per_row = (lambda x: None if x is None else x.view(b, 1).expand(b, k).reshape(-1))
    remove = by_sorting((logits.float() / t).view(b * k, vd), per_row(top_k), per_row(top_p)).view(b, k, vd)
    return logits.masked_fill(remove & (temperature > 0).view(b, 1, 1), float("-inf"))


def draft_block(logits: torch.Tensor, draft_to_target: torch.Tensor | None, temperature: torch.Tensor,
                cache_dtype: torch.dtype, top_k: torch.Tensor | None = None,
                top_p: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """logits [B, K, Vd] (draft vocabulary), draft_to_target [Vd] or None, temperature [B], top_k/top_p [B] or
    None (no request of the batch uses it) -> (drafts [B, K] target ids, the rounded, sanitized and truncated
    draft logits [B, K, Vd] to cache, number of non-finite rows [])."""
    rounded, num_bad = sanitize(logits.to(cache_dtype))
    if top_k is not None or top_p is not None:
        rounded = truncate(rounded, temperature, top_k, top_p)
    ids = draw(rounded, temperature)
    return (ids if draft_to_target is None else draft_to_target[ids]), rounded, num_bad


def cache_draft_logits(values: torch.Tensor, idx_mapping: torch.Tensor, rounded: torch.Tensor,
                       draft_to_target: torch.Tensor | None, looked_up: torch.Tensor | None = None,
                       tokens: torch.Tensor | None = None) -> None:
    """Writes rounded draft logits [B, K, Vd] into the cache values [max_reqs, K_max, V] at each request's slot
    idx_mapping [B] (real requests only: dummy runs do not cache), mapped to the target vocabulary (-inf
    outside the draft vocabulary). Where looked_up [B, K] (bool) marks a draft a lookup gave, tokens [B, K] (the
    step's drafts, target ids) holds it and its row is one-hot instead. Without a draft vocabulary `rounded` is
    overwritten in place (no second [B, K, V] tensor)."""
    b, k, _ = rounded.shape
    if draft_to_target is None:
        full = rounded
    else:
        full = rounded.new_full((b, k, values.shape[-1]), float("-inf"))
        full[..., draft_to_target] = rounded
    if looked_up is not None:
        one_hot(full, looked_up, tokens)
    values[idx_mapping.long(), :k] = full.to(values.dtype)


def one_hot(logits: torch.Tensor, rows: torch.Tensor, tokens: torch.Tensor) -> None:
    """In place: logits [B, K, V] rows where rows [B, K] (bool) is set become 0 at tokens [B, K] and -inf
    elsewhere; the other rows are unchanged. Masked writes over every row, so nothing is read back to the host."""
    at = tokens.long().unsqueeze(-1)  # [B, K, 1]
    kept = logits.gather(-1, at)  # the other rows' logit at their token, written back unchanged
    logits.masked_fill_(rows.unsqueeze(-1), float("-inf"))
    logits.scatter_(-1, at, torch.where(rows.unsqueeze(-1), torch.zeros_like(kept), kept))
