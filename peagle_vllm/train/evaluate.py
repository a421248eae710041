"""Greedy acceptance of a head, estimated offline from one forward over captured conversations: every anchor
drafts every depth 1..K at once (the training layout, nothing dropped), and a draft counts as accepted while
it and every shallower draft of its anchor equal the target's argmax. On greedy text this is what the engine
measures, up to the draft vocabulary's tokens the target never picks and the engine's K choice."""

from __future__ import annotations

import torch

from peagle_vllm.head import PEagleHead
from peagle_vllm.train.layout import build_layout


@torch.no_grad()
def acceptance_curve(head: PEagleHead, ids: torch.Tensor, aux: torch.Tensor, target_logits: torch.Tensor,
                     loss_mask: torch.Tensor, k: int) -> torch.Tensor:
    """[K] share of anchors whose first d+1 drafts are all accepted, for d = 0..K-1 (its sum + 1 is the
    acceptance length at K). ids [B, T], aux [B, T, 3*Ht], target_logits [B, T, Vd] (over the draft
    vocabulary), loss_mask [B, T]: the positions whose next token is a response token."""
    from peagle_vllm.train.objective import head_inputs

    layout = build_layout(ids.shape[1], k, 1.0, 1.0)
    slot_ids, hidden, positions = head_inputs(head, layout, ids, aux)
    normed, _ = head(slot_ids, hidden, positions, layout.attend.unsqueeze(0))
    hit = head.draft_logits(normed).argmax(-1) == target_logits.argmax(-1)[:, layout.target_index]  # [B, S]
    valid = loss_mask[:, layout.target_index]
    b, t = ids.shape
    table = torch.zeros(b, t, k, dtype=torch.bool)  # [B, anchor, depth]: the draft is right
    present = torch.zeros(b, t, k, dtype=torch.bool)  # the slot exists and is a label
    table[:, layout.anchor, layout.depth] = hit & valid
    present[:, layout.anchor, layout.depth] = valid
    prefix = table.long().cumprod(-1).bool()  # all drafts up to depth d right
    anchors = present[:, :, k - 1]  # anchors with every depth inside the response
    return prefix[anchors].float().mean(0) if anchors.any() else torch.zeros(k)
