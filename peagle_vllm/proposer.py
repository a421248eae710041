"""Turning the head's K output rows per request into drafts (plain torch; the vLLM glue that lays
out the K slots and runs the ONE forward is `vllm_adapter/proposer.py`).

Greedy requests draft the argmax (one-hot q). Sampled requests draft from q = softmax(logits / T), cut by
the request's own top-k/top-p where it has them (verification stays lossless for any q; cut as the target's
distribution is, q puts no mass where the target's has none; on CPU a row too flat for its candidates keeps them,
`truncation.within_candidates`), and keep q, so the verifier can accept with min(1, p/q). No device tensor is
read back to the host: whether any request samples is the caller's host fact (temperature None or not).
"""

from __future__ import annotations

import torch

from peagle_vllm.verify import sample_rows, target_probs


def sample_drafts(logits: torch.Tensor, draft_to_target: torch.Tensor | None, temperature: torch.Tensor | None,
                  generators: dict[int, torch.Generator] | None = None,
                  target_vocab: int | None = None, top_k: torch.Tensor | None = None,
                  top_p: torch.Tensor | None = None, candidates: int | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [B, K, Vd] over the draft vocabulary -> (drafts [B, K] as target ids,
    q [B, K, V] over the target vocabulary, or None when temperature is None).

    temperature [B]: None when every request is greedy (vLLM's host-side all_greedy), else rows <= 0 are
    greedy (argmax drafts, one-hot q); top_k, top_p [B] or None: the requests' own, applied to q over the draft
    vocabulary (`verify.target_probs`; with `candidates`, CPU only, a row they do not decide keeps them: q need
    only resemble the cut distribution); draft_to_target [Vd] maps draft ids to target ids (None: identical
    vocabularies). generators maps a request row to its seeded generator."""
    b, k, vd = logits.shape
    greedy_ids = logits.argmax(-1)
    if temperature is None:
        ids, q = greedy_ids, None
    else:
        per_row = [None if x is None else x.repeat_interleave(k) for x in (temperature, top_k, top_p)]
        q_draft = target_probs(logits.reshape(b * k, vd), *per_row, candidates=candidates, resemble=True).view(b, k, vd)
        row_gens = {r * k + j: g for r, g in (generators or {}).items() for j in range(k)} if generators else None
        sampled = sample_rows(q_draft.view(b * k, vd), row_gens).view(b, k)
        is_greedy = (temperature <= 0).view(b, 1)
        ids = torch.where(is_greedy, greedy_ids, sampled)
        one_hot = q_draft.new_zeros(b, k, vd).scatter_(2, greedy_ids.unsqueeze(2), 1.0)
        q_draft = torch.where(is_greedy.unsqueeze(-1), one_hot, q_draft)
        vocab = target_vocab or vd
        index = (draft_to_target if draft_to_target is not None else torch.arange(vd, device=logits.device))
        q = q_draft.new_zeros(b * k, vocab).scatter_(1, index.long().expand(b * k, vd), q_draft.view(b * k, vd))
        q = q.view(b, k, vocab)
    if draft_to_target is not None:
        ids = draft_to_target[ids]
    return ids, q

