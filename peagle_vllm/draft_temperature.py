"""The draft temperature: sampled drafts are drawn from q = softmax(head logits / (T x draft_temperature)).

A head trained by KL(target || draft) on little data is flatter than the target, so at the request's own T its q
overlaps the target's p less than a sharper q would. Verification is lossless for any q, so the factor changes
acceptance only, never what is emitted. `calibrate` picks it from recorded pairs of the head's logits and the
target's distributions: the factor whose q maximises the expected accepted length, sum_i prod_{j<=i} alpha_j, where
alpha_j = sum_v min(p_j(v), q_j(v)) is token-wise verification's acceptance rate of draft j.
"""

from __future__ import annotations

import math

import torch

from peagle_vllm.truncation import CPU_CANDIDATES
from peagle_vllm.verify import target_probs

SCALES = tuple(round(0.2 + 0.05 * i, 2) for i in range(27))  # 0.2 .. 1.5: the factors `calibrate` tries


class DraftTemperatureError(ValueError):
    """A draft temperature that is not a number in (0, 8]; the message names the field and the fix."""


def checked(value, where: str) -> float:
    """`value` as a float when it is a number in (0, 8]; else one line naming `where` and the fix."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 8 or math.isnan(value):
        raise DraftTemperatureError(f"{where} must be a number above 0 and at most 8 (the request's temperature is "
                                    f"multiplied by it for drafting; 1 = the head's logits as they are), got {value!r}")
    return float(value)


def expected_length(alpha: torch.Tensor) -> torch.Tensor:
    """alpha [N, K] acceptance rate of each draft -> [N] expected accepted drafts, sum_i prod_{j<=i} alpha_j."""
    return alpha.cumprod(dim=1).sum(dim=1)


def acceptance_rates(p: torch.Tensor, draft_logits: torch.Tensor, draft_ids: torch.Tensor | None, scale: float,
                     top_p: float = 1.0) -> torch.Tensor:
    """p [N, K, V] target distributions, draft_logits [N, K, Vd], draft_ids [Vd] target id of each draft id (None:
    the same vocabulary) -> alpha [N, K] at temperature 1 x `scale`, q cut by `top_p` as drafts are on a CPU."""
    n, k, vd = draft_logits.shape
    rows = n * k
    q = target_probs(draft_logits.reshape(rows, vd).float(), torch.full((rows,), scale),
                     top_p=None if top_p >= 1 else torch.full((rows,), top_p), candidates=CPU_CANDIDATES,
                     resemble=True).view(n, k, vd)
    p_draft_vocab = p if draft_ids is None else p[:, :, draft_ids]  # the target's mass outside it is never drafted
    return torch.minimum(p_draft_vocab.float(), q).sum(-1)


def calibrate(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_ids: torch.Tensor | None,
              top_p: float = 1.0, scales: tuple[float, ...] = SCALES, chunk: int = 256
              ) -> tuple[float, dict[float, float]]:
    """(best factor, {factor: mean expected accepted drafts}) over `scales`, from the target's logits [N, K, V] at
    the drafts' positions and the head's draft_logits [N, K, Vd] (see `acceptance_rates`), both sampled at
    temperature 1 and cut by `top_p`; `chunk` steps at a time."""
    n, k, v = target_logits.shape
    totals = dict.fromkeys(scales, 0.0)
    for start in range(0, n, chunk):
        rows = target_logits[start:start + chunk].reshape(-1, v).float()
        ones = torch.ones(rows.shape[0])
        p = target_probs(rows, ones, top_p=None if top_p >= 1 else torch.full_like(ones, top_p),
                         candidates=CPU_CANDIDATES).view(-1, k, v)
        for s in scales:
            totals[s] += float(expected_length(acceptance_rates(p, draft_logits[start:start + chunk], draft_ids, s,
                                                                top_p)).sum())
    scores = {s: total / max(n, 1) for s, total in totals.items()}
    return max(scores, key=scores.get), scores
