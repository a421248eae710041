"""Lossless verification over each draft row's kept candidates instead of the whole vocabulary, and draws
among a row's kept candidates (`draw_kept`).

Where top-k/top-p leave a target row p its candidates only (`truncation.kept_candidates`), everything the
verifier reads lies in a small vocabulary of its own: p's C candidates, then one slot for the draft token. Rules:
p is 0 outside the candidates, so the residual max(p - q, 0) and block verification's sums need q on the
candidates only, and the acceptance ratio p/q needs q at the draft alone; the draft's slot holds q there and p = 0
when the draft is not a candidate (else its candidate's slot is used and the extra slot holds nothing). Rows of
a batch share their width C: a row padded to it repeats a candidate at p = 0 (`widened`). Each
distribution is then the whole row's, re-indexed, and `verify` runs unchanged on [B, K, C + 1] rows instead of
[B, K, V]. Seeded requests stay on the whole vocabulary: their draws are defined over it (`verify.sample_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Slots:
    """Where `verify` finds the tokens of distributions over slots: ids [B, K, M] the token id of each slot of each
    draft position, drafts [B, K] each draft's slot."""

    ids: torch.Tensor
    drafts: torch.Tensor


@dataclass
class CandidateRows:
    """Flat draft rows [N] over their own vocabularies of M = C + 1 slots."""

    ids: torch.Tensor  # [N, M] token id of each slot (the last: the draft's own)
    drafts: torch.Tensor  # [N] each draft's slot
    p: torch.Tensor  # [N, M] target distribution (0 in the draft's slot)
    q: torch.Tensor | None  # [N, M] draft distribution on the slots; None: one-hot drafts


def candidate_rows(drafts: torch.Tensor, ids: torch.Tensor, p: torch.Tensor,
                   q_of: torch.Tensor | None) -> CandidateRows:
    """drafts [N] token ids; ids [N, C] each row's candidates (a copy after its first slot, with p = 0, allowed)
    and p [N, C] the target's distribution over them (summing to 1); q_of [N, V] the draft distribution over the
    whole vocabulary (None: one-hot drafts)."""
    n, c = ids.shape
    is_draft = ids == drafts.unsqueeze(1)  # [N, C]
    candidate = is_draft.any(1)
    slot = torch.where(candidate, is_draft.int().argmax(1), c)
    q = None
    if q_of is not None:
        q_extra = torch.where(candidate, 0.0, q_of.gather(1, drafts.unsqueeze(1)).squeeze(1).float())
        q = torch.cat([q_of.gather(1, ids).float(), q_extra.unsqueeze(1)], dim=1)
    return CandidateRows(torch.cat([ids, drafts.unsqueeze(1)], dim=1), slot,
                         torch.cat([p.float(), p.new_zeros(n, 1, dtype=torch.float32)], dim=1), q)


def widened(ids: torch.Tensor, kept: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids, kept [N, C] (candidates and their logits, -inf where cut) padded to [N, width] with copies of each row's
    first candidate at -inf: a copy has p = 0, so its q adds nothing to the residual or the block's sums, and a draft
    takes its first slot, the candidate's own."""
    pad = width - ids.shape[1]
    return (torch.cat([ids, ids[:, :1].expand(-1, pad)], dim=1),
            torch.cat([kept, kept.new_full((kept.shape[0], pad), float("-inf"))], dim=1))


def token_ids(slot_ids: torch.Tensor, position: torch.Tensor, slot: torch.Tensor) -> torch.Tensor:
    """slot_ids [B, K, M], position [B] and slot [B] -> [B] the token id in slot[b] of request b's position[b]."""
    rows = torch.arange(slot_ids.shape[0], device=slot_ids.device)
    return slot_ids[rows, position, slot.clamp(0, slot_ids.shape[2] - 1)]


def draw_kept(ids: torch.Tensor, kept: torch.Tensor, noise: torch.dtype = torch.float32) -> torch.Tensor:
    """[N] one token id per row drawn from softmax(kept): an exponential race, argmax(kept - log E) with E ~ Exp(1)
    (`noise` its dtype), exact for any row with a finite logit. ids, kept [N, C]: candidates and their logits
    (-inf where cut)."""
    race = kept.to(noise) - torch.empty(kept.shape, dtype=noise, device=kept.device).exponential_().log()
    return ids.gather(1, race.argmax(1, keepdim=True)).squeeze(1)
