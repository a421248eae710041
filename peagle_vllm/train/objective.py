"""Draft vocabulary selection and the training objective: KL(target || draft) over the draft vocabulary at every
slot of a layout, per depth, weighted toward the first drafts."""

from __future__ import annotations

import torch

from peagle_vllm.head import PEagleHead
from peagle_vllm.train.layout import SlotLayout

DEPTH_DECAY = 0.8  # a stage's default (and that of stages logged without one): depth d's loss weighs 0.8**d


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


def head_inputs(head: PEagleHead, layout: SlotLayout, ids: torch.Tensor, aux: torch.Tensor) -> tuple:
    """(input ids, fc-combined hidden, positions) [B, S] for the slots of `layout`."""
    b = ids.shape[0]
    real = layout.depth == 0
    slot_ids = ids[:, layout.anchor + 1]
    if head.cfg.mask_token_id is not None:  # (an eagle3 head has no mask slots, and no mask token)
        slot_ids = torch.where(real, slot_ids, head.cfg.mask_token_id)
    hidden = head.combine_hidden_states(aux)[:, layout.anchor]  # fc once per position, then one row per slot
    if head.cfg.num_mask_slots and bool((~real).any()):
        mask_rows = head.mask_states(head.cfg.trained_depth - 1) if head.cfg.variant == "depth" else head.mask_states(1)
        pick = (layout.depth - 1).clamp(min=0) if head.cfg.variant == "depth" else torch.zeros_like(layout.depth)
        hidden = torch.where(real.view(1, -1, 1), hidden, mask_rows[pick].unsqueeze(0).expand(b, -1, -1))
    return slot_ids, hidden, layout.positions.expand(b, -1)


def step_loss(head: PEagleHead, layout: SlotLayout, ids: torch.Tensor, aux: torch.Tensor, logits: torch.Tensor,
              loss_mask: torch.Tensor | None = None, depth_decay: float = DEPTH_DECAY
              ) -> tuple[torch.Tensor, dict[int, float]]:
    """Per-depth mean KL, depth d weighted by depth_decay**d (acceptance at depth d needs every shallower
    draft accepted first, so early depths matter most); also top-1 agreement with the target per depth.

    ids [B, T], aux [B, T, 3*Ht], logits [B, T, Vd]: the target's logits over the draft vocabulary;
    loss_mask [B, T] (None: all): which positions' distributions are labels."""
    slot_ids, hidden, positions = head_inputs(head, layout, ids, aux)
    normed, _ = head(slot_ids, hidden, positions, layout.attend.unsqueeze(0))
    draft = head.draft_logits(normed)  # [B, S, Vd]
    kl = kl_at_positions(draft, logits, layout.target_index)  # [B, S]
    agree = (draft.argmax(-1) == logits.argmax(-1)[:, layout.target_index]).float()
    valid = (torch.ones_like(kl, dtype=torch.bool) if loss_mask is None else loss_mask[:, layout.target_index]).float()
    losses, weights, accuracy = [], [], {}
    for d in layout.depth.unique().tolist():
        sel = layout.depth == d
        count = valid[:, sel].sum()
        if count == 0:
            continue
        losses.append((kl[:, sel] * valid[:, sel]).sum() / count)
        weights.append(depth_decay**d)
        accuracy[d] = ((agree[:, sel] * valid[:, sel]).sum() / count).item()
    w = torch.tensor(weights, device=kl.device)
    return (torch.stack(losses) * w).sum() / w.sum(), accuracy
