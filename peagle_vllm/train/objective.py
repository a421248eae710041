"""Draft vocabulary selection and the KL(target || draft) objective over the draft vocabulary."""

from __future__ import annotations

import torch


def draft_vocabulary(token_counts: torch.Tensor, size: int, always: list[int] | None = None) -> torch.Tensor:
    """Sorted target ids of the `size` most frequent tokens (plus `always`, e.g. EOS)."""
    counts = token_counts.clone().float()
    for t in always or []:
        counts[t] = float("inf")
    return counts.topk(min(size, len(counts))).indices.sort().values


def kl_to_target(draft_logits: torch.Tensor, target_logits: torch.Tensor, vocab: torch.Tensor | None) -> torch.Tensor:
    """Per-row KL(p || q) [N]: p = target distribution restricted and renormalised to the draft
    vocabulary, q = softmax of the draft logits [N, Vd]. Zero exactly when q equals that p."""
    target = target_logits.float() if vocab is None else target_logits.float()[:, vocab]
    log_p = target.log_softmax(-1)
    log_q = draft_logits.float().log_softmax(-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


def kl_at_positions(draft_logits: torch.Tensor, target_logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Per-slot KL(p || q) [B, S] where slot s learns the target's distribution at position index[s]:
    draft_logits [B, S, Vd], target_logits [B, T, Vd] (already over the draft vocabulary), index [S].
    Equal to `kl_to_target` on the gathered rows; the target's softmax and entropy are computed once per
    position (many slots share one), and the cross-entropy is torch's fused one."""
    log_p = target_logits.float().log_softmax(-1)  # [B, T, Vd]
    p = log_p.exp()
    entropy = -(p * log_p).sum(-1)  # [B, T]
    b, s, vd = draft_logits.shape
    cross = torch.nn.functional.cross_entropy(draft_logits.float().reshape(b * s, vd),
                                              p[:, index].reshape(b * s, vd), reduction="none").view(b, s)
    return cross - entropy[:, index]
