"""Block rejection sampler for B requests x up to 32 drafts: greedy, lossless token-wise
(Leviathan et al. 2023) and lossless block verification (Sun et al. 2024). Plain torch.

Inputs are padded to [B, K]; row b has `num_draft[b]` real drafts (padding is never accepted).
Target distributions are the *processed* ones (temperature, min-p, top-k, top-p applied by
`target_probs`), so the emitted tokens follow exactly what plain sampling would draw. The bonus
token (all drafts accepted) is supplied by the caller, sampled from the target's last row.

Target and draft distributions are [B, K, V] tensors or `PositionDists`, which serve them a position (or a
row per request) at a time: at K=32 and a 128k vocabulary, [B, K, V] float32 is gigabytes the sampler never
holds at once (see `vllm_adapter.v1.sampler`).

Opt-in lossy acceptance for greedy rows (speculators' `verifier_accept_k` / `accept_tolerance`):
`within_tolerance`; sampled rows always stay lossless. Nothing here reads a device tensor back to the
host: per-row options are masks, and only host facts (shapes, Python arguments) choose branches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from peagle_vllm import truncation
from peagle_vllm.candidate_vocab import Slots, token_ids

PLACEHOLDER = -1


class PositionDists(Protocol):
    """Distributions [B, K, V] over a padded [B, K] draft layout, served a piece at a time."""

    vocab: int

    def position(self, i: int) -> torch.Tensor:
        """[B, V]: draft position i of every request."""

    def at(self, cols: torch.Tensor) -> torch.Tensor:
        """cols [B] -> [B, V]: position cols[b] of request b."""

    def of_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, K] -> [B, K]: each id's probability at its own position."""


Dists = torch.Tensor | PositionDists  # a tensor is [B, K, V]


def _position(d: Dists, i: int) -> torch.Tensor:
    return d[:, i] if isinstance(d, torch.Tensor) else d.position(i)


def _at(d: Dists, cols: torch.Tensor) -> torch.Tensor:
    if isinstance(d, torch.Tensor):
        return d[torch.arange(cols.shape[0], device=cols.device), cols]
    return d.at(cols)


def _of_tokens(d: Dists, ids: torch.Tensor) -> torch.Tensor:
    return d.gather(2, ids.unsqueeze(2)).squeeze(2) if isinstance(d, torch.Tensor) else d.of_tokens(ids)


def _vocab(d: Dists) -> int:
    return d.shape[-1] if isinstance(d, torch.Tensor) else d.vocab


@dataclass
class VerifyResult:
    tokens: torch.Tensor  # [B, K+1] int64, emitted tokens then PLACEHOLDER
    num_accepted: torch.Tensor  # [B] accepted drafts (emitted = num_accepted + 1)
    accepted: torch.Tensor  # [B, K] bool, draft i accepted (prefix only)


def scaled_logits(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """logits [N, V] / temperature [N] in float32; rows with temperature 0 (greedy) are left at temperature 1."""
    return logits.float() / torch.where(temperature > 0, temperature, 1.0).float().unsqueeze(-1)


def target_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None = None,
                 top_p: torch.Tensor | None = None, min_p: torch.Tensor | None = None,
                 candidates: int | None = None, resemble: bool = False) -> torch.Tensor:
    """Sampling distribution [N, V] (float32) from logits [N, V] and per-row parameters [N], in vLLM's
    order: temperature, min-p, then top-k and top-p. Rows with temperature 0 get temperature 1
    (greedy rows never read their probabilities). Per row, top_k <= 0 or >= V, top_p >= 1 and
    min_p <= 0 mean off; None (as vLLM passes when no request uses the option) skips its work.
    candidates: top-k/top-p decided from that many most likely tokens per row (`truncation.by_candidates`,
    which reads the device: pass it for CPU tensors only); None sorts every row. resemble (with candidates): rows the
    candidates do not decide keep their candidates instead (`truncation.within_candidates`): for a draft's q only."""
    logits = scaled_logits(logits, temperature)
    if min_p is not None:  # min_p 0: nothing is below 0 * max
        probs = logits.softmax(-1)
        too_small = probs < probs.amax(-1, keepdim=True) * min_p.float().unsqueeze(-1)
        logits = logits.masked_fill(too_small, float("-inf"))
    if top_k is not None or top_p is not None:
        if candidates is None:
            remove = truncation.by_sorting(logits, top_k, top_p)
        else:
            cut = truncation.within_candidates if resemble else truncation.by_candidates
            remove = cut(logits, top_k, top_p, candidates)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits.softmax(-1)


def _assemble(drafts: torch.Tensor, num_accepted: torch.Tensor, last: torch.Tensor) -> VerifyResult:
    b, k = drafts.shape
    cols = torch.arange(k + 1, device=drafts.device)
    tokens = torch.cat([drafts.long(), torch.zeros(b, 1, dtype=torch.long, device=drafts.device)], dim=1)
    tokens = torch.where(cols < num_accepted.unsqueeze(1), tokens, PLACEHOLDER)
    tokens.scatter_(1, num_accepted.unsqueeze(1), last.long().unsqueeze(1))
    accepted = cols[:k] < num_accepted.unsqueeze(1)
    return VerifyResult(tokens, num_accepted, accepted)


def _valid(num_draft: torch.Tensor, k: int) -> torch.Tensor:
    return torch.arange(k, device=num_draft.device) < num_draft.unsqueeze(1)


def _prefix_len(ok: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of True in each row of [B, K]."""
    return ok.long().cumprod(dim=1).sum(dim=1)


def _accept_prefix_then_argmax(drafts: torch.Tensor, num_draft: torch.Tensor, ok: torch.Tensor,
                               target_argmax: torch.Tensor, bonus: torch.Tensor) -> VerifyResult:
    """The longest prefix of drafts with `ok` [B, K], then the target's argmax there (bonus [B] after all)."""
    k = drafts.shape[1]
    n = _prefix_len(ok & _valid(num_draft, k))
    at = target_argmax.gather(1, n.clamp(max=k - 1).unsqueeze(1)).squeeze(1) if k else bonus
    return _assemble(drafts, n, torch.where(n == num_draft, bonus, at))


def verify_greedy(drafts: torch.Tensor, num_draft: torch.Tensor, target_argmax: torch.Tensor,
                  bonus: torch.Tensor) -> VerifyResult:
    """Longest prefix equal to the target's argmax, then the target's token (argmax or bonus)."""
    return _accept_prefix_then_argmax(drafts, num_draft, drafts == target_argmax, target_argmax, bonus)


def is_lossy(accept_k: int, tolerance: float) -> bool:
    """Tolerance acceptance changes anything only with both accept_k > 1 and tolerance > 0."""
    return accept_k > 1 and tolerance > 0


def within_tolerance(drafts: torch.Tensor, target_logits: torch.Tensor, target_argmax: torch.Tensor,
                     accept_k: int, tolerance: float) -> torch.Tensor:
    """[B, K] bool, speculators' rule per draft: equal to the target's argmax, or among its `accept_k` most
    likely tokens (fewer than accept_k strictly more likely) with log p_top - log p_draft <= tolerance, p
    the softmax of the processed target logits [B, K, V] at temperature 1. Lossless (exact matches only)
    unless `is_lossy(accept_k, tolerance)`."""
    exact = drafts == target_argmax
    if not is_lossy(accept_k, tolerance):
        return exact
    logp = target_logits.float().log_softmax(-1)  # [B, K, V]
    logp_draft = logp.gather(2, _ids(drafts).unsqueeze(2))  # [B, K, 1]
    logp_top = logp.gather(2, target_argmax.long().unsqueeze(2))  # [B, K, 1]
    in_top_k = (logp > logp_draft).sum(-1) < accept_k
    close = (logp_top - logp_draft).squeeze(2) <= tolerance  # a banned draft (-inf) never is
    return exact | (in_top_k & close)


def verify_tolerant(drafts: torch.Tensor, num_draft: torch.Tensor, target_logits: torch.Tensor,
                    target_argmax: torch.Tensor, bonus: torch.Tensor, accept_k: int,
                    tolerance: float) -> VerifyResult:
    """Greedy rows under `within_tolerance`: the longest prefix passing it, then the target's argmax
    (bonus after all). drafts [B, K], target_logits [B, K, V], target_argmax [B, K], bonus [B]."""
    ok = within_tolerance(drafts, target_logits, target_argmax, accept_k, tolerance)
    return _accept_prefix_then_argmax(drafts, num_draft, ok, target_argmax, bonus)


def _ids(drafts: torch.Tensor) -> torch.Tensor:
    """Draft ids usable as indices (padding slots, never accepted, may hold -1)."""
    return drafts.long().clamp_min(0)


def _draft_prob_of(drafts: torch.Tensor, draft_probs: Dists | None) -> torch.Tensor:
    if draft_probs is None:
        return torch.ones(drafts.shape, dtype=torch.float32, device=drafts.device)
    return _of_tokens(draft_probs, _ids(drafts)).float()


def _draft_dist_at(drafts: torch.Tensor, draft_probs: Dists | None, cols: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, V]: the draft distribution at position cols[b] of request b (one-hot drafts when draft_probs is None)."""
    if draft_probs is not None:
        return _at(draft_probs, cols).float()
    rows = torch.arange(drafts.shape[0], device=drafts.device)
    return torch.nn.functional.one_hot(_ids(drafts)[rows, cols], vocab).float()


def _draft_dist_position(drafts: torch.Tensor, draft_probs: Dists | None, i: int, vocab: int) -> torch.Tensor:
    """[B, V]: the draft distribution at position i of every request."""
    if draft_probs is not None:
        return _position(draft_probs, i).float()
    return torch.nn.functional.one_hot(_ids(drafts)[:, i], vocab).float()


def sample_rows(weights: torch.Tensor, generators: dict[int, torch.Generator] | None = None) -> torch.Tensor:
    """One draw per row of unnormalised non-negative weights [B, V] -> [B] ids. Rows listed in `generators`
    (seeded requests) race exponential noise from their own generator, V draws per row whatever the weights: a
    seed's tokens then stay the same when the drafts change, e.g. however its prompt was chunked. The others draw
    by inverse transform: a uniform per row, scaled to the row's total, looked up in the running sums of all rows
    laid end to end (one scan and one search in float64, instead of V random numbers a row). A zero weight is
    never drawn."""
    b, v = weights.shape
    if b == 0:
        return torch.zeros(0, dtype=torch.long, device=weights.device)
    cdf = weights.reshape(-1).to(torch.float64).cumsum(0)  # [B*V]
    ends = cdf[v - 1::v]  # [B] running sum at each row's last token
    starts = torch.cat([ends.new_zeros(1), ends[:-1]])
    u = torch.rand(b, dtype=torch.float64, device=weights.device)
    point = torch.minimum(starts + u * (ends - starts), torch.nextafter(ends, starts))  # in [start, end)
    first_above = torch.searchsorted(cdf, point, right=True)  # the first token whose running sum passes it
    ids = (first_above - torch.arange(b, device=weights.device) * v).clamp_(0, v - 1)
    for row, gen in (generators or {}).items():
        if row < b:
            noise = torch.empty(v, dtype=torch.float32, device=weights.device).exponential_(generator=gen)
            ids[row] = (weights[row].float() / noise).argmax()
    return ids


def _uniforms(shape: tuple[int, int], device: torch.device, generators: dict[int, torch.Generator] | None) -> torch.Tensor:
    u = torch.rand(shape, dtype=torch.float64, device=device)
    for row, gen in (generators or {}).items():
        if row < shape[0]:
            u[row] = torch.rand(shape[1], dtype=torch.float64, generator=gen, device=device)
    return u


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """max(p - q, 0), falling back to p where that is all zero (p == q up to rounding)."""
    r = (p - q).clamp_min(0)
    empty = r.sum(-1, keepdim=True) <= 0
    return torch.where(empty, p, r)


def verify_standard(drafts: torch.Tensor, num_draft: torch.Tensor, draft_probs: Dists | None,
                    probs: Dists, bonus: torch.Tensor,
                    generators: dict[int, torch.Generator] | None = None) -> VerifyResult:
    """Token-wise speculative sampling: accept draft i with min(1, p/q); on the first rejection
    draw from normalised max(p - q, 0). draft_probs None = one-hot drafts. probs [B, K, V]."""
    b, k = drafts.shape
    if k == 0:
        return _assemble(drafts, torch.zeros(b, dtype=torch.long, device=drafts.device), bonus)
    p_x = _of_tokens(probs, _ids(drafts))
    q_x = _draft_prob_of(drafts, draft_probs)
    u = _uniforms((b, k), drafts.device, generators)
    n = _prefix_len((u * q_x <= p_x) & (p_x > 0) & _valid(num_draft, k))
    j = n.clamp(max=k - 1)
    p_j = _at(probs, j)
    q_j = _draft_dist_at(drafts, draft_probs, j, _vocab(probs))
    recovered = sample_rows(_residual(p_j, q_j), generators)
    return _assemble(drafts, n, torch.where(n == num_draft, bonus, recovered))


def verify_block(drafts: torch.Tensor, num_draft: torch.Tensor, draft_probs: Dists | None,
                 probs: Dists, bonus: torch.Tensor,
                 generators: dict[int, torch.Generator] | None = None) -> VerifyResult:
    """Block verification (Sun et al., 2024): decides the accepted length from the whole block's
    likelihood ratios, lossless and accepting at least as much as token-wise in expectation.
    Reads probs [B, K, V] a position at a time, in order, then the stopping position's row again."""
    b, k = drafts.shape
    dev = drafts.device
    if k == 0:
        return _assemble(drafts, torch.zeros(b, dtype=torch.long, device=dev), bonus)
    vocab, ids = _vocab(probs), _ids(drafts)
    q_x = _draft_prob_of(drafts, draft_probs).clamp_min(1e-30)  # [B, K]

    def ratio_at(i: int, p_i: torch.Tensor) -> torch.Tensor:  # p_i [B, V] -> [B], p/q of draft i
        return p_i.gather(1, ids[:, i:i + 1]).squeeze(1) / q_x[:, i]

    ratio = ratio_at(0, _position(probs, 0))
    gamma = num_draft.long()
    rows = torch.arange(b, device=dev)
    weight = torch.ones(b, dtype=torch.float64, device=dev)  # p_{i-1}, starting at p_0 = 1
    weights = [weight]
    h = torch.zeros(b, k, dtype=torch.float64, device=dev)
    for i in range(1, k + 1):  # 1-based draft index, as in the paper
        weight = torch.clamp(weights[-1] * ratio.double(), max=1.0)
        weights.append(weight)
        if i < k:
            p_i = _position(probs, i)
            ratio = ratio_at(i, p_i)
            nxt = (weight.unsqueeze(1) * p_i.double() - _draft_dist_position(drafts, draft_probs, i, vocab).double())
            nxt = nxt.clamp_min(0).sum(-1)
            del p_i  # a position made on demand is freed before the next one is made
            denom = nxt + 1.0 - weight
            h_i = torch.where(denom > 0, nxt / denom.clamp_min(1e-300), torch.ones_like(weight))
        else:
            h_i = weight
        h[:, i - 1] = torch.where(i == gamma, weight, h_i)
    eta = _uniforms((b, k), dev, generators)
    idx = torch.arange(1, k + 1, device=dev)
    hit = (eta <= h) & (idx <= gamma.unsqueeze(1))
    tau = torch.where(hit, idx, 0).amax(dim=1)
    w_tau = torch.stack(weights, dim=1)[rows, tau].float()
    t_pos = tau.clamp(max=k - 1)
    residual = _residual(w_tau.unsqueeze(1) * _at(probs, t_pos), _draft_dist_at(drafts, draft_probs, t_pos, vocab))
    recovered = sample_rows(residual, generators)
    return _assemble(drafts, tau, torch.where(tau == gamma, bonus, recovered))


def verify(mode: str, drafts: torch.Tensor, num_draft: torch.Tensor, draft_probs: Dists | None,
           probs: Dists | None, target_argmax: torch.Tensor | None, bonus: torch.Tensor, is_greedy: torch.Tensor,
           generators: dict[int, torch.Generator] | None = None, accept_k: int = 1, accept_tolerance: float = 0.0,
           target_logits: torch.Tensor | None = None, slots: Slots | None = None) -> VerifyResult:
    """Mixed batch: temperature-0 rows by argmax match (or, when `is_lossy(accept_k, accept_tolerance)`, by
    `within_tolerance` over target_logits [B, K, V]), the others losslessly by `mode` ("block", or token-wise
    for "standard"/"auto"). probs [B, K, V] None: every row is greedy; target_argmax [B, K] None: none is (host
    facts the caller has). slots: probs and draft_probs are [B, K, M] over each position's own M slots
    (`candidate_vocab`), with no generators."""
    greedy = None
    if target_argmax is not None and is_lossy(accept_k, accept_tolerance):
        if target_logits is None:
            raise ValueError("verify: lossy acceptance (accept_k > 1, accept_tolerance > 0) needs target_logits")
        greedy = verify_tolerant(drafts, num_draft, target_logits, target_argmax, bonus, accept_k, accept_tolerance)
    elif target_argmax is not None:
        greedy = verify_greedy(drafts, num_draft, target_argmax, bonus)
    if probs is None:
        return greedy
    sampler = verify_block if mode == "block" else verify_standard
    if slots is None:
        sampled = sampler(drafts, num_draft, draft_probs, probs, bonus, generators)
    else:
        if generators:
            raise ValueError("verify: seeded requests draw over the whole vocabulary, not over slots")
        on_slots = sampler(slots.drafts, num_draft, draft_probs, probs, bonus)
        n = on_slots.num_accepted  # then the bonus (all accepted) or the slot of the token drawn at position n
        last = on_slots.tokens.gather(1, n.unsqueeze(1)).squeeze(1)
        drawn = token_ids(slots.ids, n.clamp(max=drafts.shape[1] - 1), last)
        sampled = _assemble(drafts, n, torch.where(n == num_draft, bonus, drawn))
    if greedy is None:
        return sampled
    pick = is_greedy.unsqueeze(1)
    return VerifyResult(torch.where(pick, greedy.tokens, sampled.tokens),
                        torch.where(is_greedy, greedy.num_accepted, sampled.num_accepted),
                        torch.where(pick, greedy.accepted, sampled.accepted))
