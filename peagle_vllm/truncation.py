"""Which tokens top-k and top-p remove from a row of logits, in vLLM's order (top-k first, then top-p over what
top-k kept): a token is removed by top-p when the probability of the tokens ranked above it reaches top_p.

Two ways to the same mask. `by_sorting` sorts the whole vocabulary and reads nothing back to the host.
`by_candidates` looks only at each row's `candidates` most likely tokens, which decide every row whose top-k
cut or top-p mass falls among them (at T=1, top-p 0.9 a language model's row usually does); the rows they leave
undecided try `WIDER` times as many, and only what is left then is sorted: sorting a 49k vocabulary is ~3.5 ms a
row on a CPU core, its 256 most likely tokens ~0.1 ms, its 2,048 ~0.4 ms. Picking the undecided rows reads the
device, so callers use it only where that is free (CPU tensors).

A third way, `within_candidates`, makes `by_candidates`' mask where the candidates decide a row and keeps only the
candidates where they do not: not the exact mask, for distributions that need only resemble the cut one (a draft's
q, which verification corrects losslessly whatever it is; a weak head's rows are often too flat for 256 tokens).

`kept_candidates` gives the candidates themselves (ids and logits, cut ones at -inf) and the rows where they hold
every token `by_candidates` keeps: there a distribution over the candidates is the whole row's (`candidate_vocab`).
"""

from __future__ import annotations

import torch

CPU_CANDIDATES = 256  # `by_candidates`' candidates per row where reading the device is free (CPU tensors)
WIDER = 8  # rows the candidates leave undecided try this many times as many before they are sorted whole


def _k_of(top_k: torch.Tensor, vocab: int) -> torch.Tensor:
    """[N] top-k per row with off (<= 0 or >= V) as V: no rank reaches it."""
    return torch.where((top_k > 0) & (top_k < vocab), top_k, vocab).long()


def truncation_on(top_k: torch.Tensor | None, top_p: torch.Tensor | None, vocab: int) -> torch.Tensor | None:
    """[N] bool, rows whose top-k or top-p is on (top_p < 1, or 0 < top_k < V); None when neither is given."""
    if top_k is None and top_p is None:
        return None
    on = torch.zeros_like(top_p if top_p is not None else top_k, dtype=torch.bool)
    if top_p is not None:
        on |= top_p < 1
    if top_k is not None:
        on |= _k_of(top_k, vocab) < vocab
    return on


def by_sorting(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """[N, V] bool, True where top-k / top-p remove the token. logits [N, V] float32; top_k, top_p [N] or None."""
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)
    remove = torch.zeros_like(sorted_logits, dtype=torch.bool)
    if top_k is not None:
        remove |= ranks >= _k_of(top_k, vocab).unsqueeze(-1)
    if top_p is not None:
        sorted_probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(-1)
        mass_before = sorted_probs.cumsum(-1) - sorted_probs
        cut = (mass_before >= top_p.float().unsqueeze(-1)) & (ranks > 0)
        remove |= cut & (top_p < 1).unsqueeze(-1)  # top_p 1 is off even where rounding pushes the mass past 1
    return remove.scatter(-1, order, remove)


def by_candidates(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                  candidates: int) -> torch.Tensor:
    """`by_sorting`'s mask from each row's `candidates` most likely tokens; rows they do not decide (top-k beyond
    them, or their mass short of top_p) try `WIDER` times as many, and are sorted whole once that would reach the
    vocabulary. Reads the device: for CPU tensors."""
    vocab = logits.shape[-1]
    lowest_kept, undecided, _, _ = _cut_among_candidates(logits, top_k, top_p, candidates)
    remove = logits < lowest_kept.unsqueeze(-1)
    to_sort = undecided.nonzero().squeeze(-1)  # the host read
    if to_sort.numel():
        rows, k_rows, p_rows = (logits[to_sort], None if top_k is None else top_k[to_sort],
                                None if top_p is None else top_p[to_sort])
        wider = WIDER * min(candidates, vocab)
        remove[to_sort] = (by_candidates(rows, k_rows, p_rows, wider) if wider < vocab
                           else by_sorting(rows, k_rows, p_rows))
    return remove


def within_candidates(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                      candidates: int) -> torch.Tensor:
    """`by_candidates`' mask on the rows the candidates decide; a row they do not decide keeps its candidates (and
    tokens tied with the last) and nothing else. Reads nothing back to the host."""
    lowest_kept, undecided, top, _ = _cut_among_candidates(logits, top_k, top_p, candidates)
    return logits < torch.where(undecided, top[:, -1], lowest_kept).unsqueeze(-1)


def kept_candidates(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                    candidates: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids [N, c], kept [N, c], whole [N]): each row's c = `candidates` most likely tokens, their logits with the
    ones `by_candidates` removes at -inf, and whether they hold every token it keeps (the candidates decide the
    row and cut at least one of their own, so no token outside them ties with a kept one). Reads nothing back."""
    lowest_kept, undecided, top, ids = _cut_among_candidates(logits, top_k, top_p, candidates)
    whole = ~undecided & (lowest_kept > top[:, -1])  # a row where nothing is on keeps -inf: never whole
    return ids, top.masked_fill(top < lowest_kept.unsqueeze(-1), float("-inf")), whole


def _cut_among_candidates(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                          candidates: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lowest_kept [N], undecided [N], top [N, c], ids [N, c]): sorting's cut on the rows each row's c = `candidates`
    most likely tokens (`top`, descending, token ids `ids`) decide, as the lowest logit kept (every token below it
    is removed; -inf where nothing is on), and which rows they leave undecided (their cut is then not sorting's)."""
    n, vocab = logits.shape
    c = min(candidates, vocab)
    top, ids = logits.topk(c, dim=-1)  # [N, c], descending
    ranks = torch.arange(c, device=logits.device)
    k = _k_of(top_k, vocab) if top_k is not None else torch.full((n,), vocab, device=logits.device)
    removed = ranks >= k.unsqueeze(-1)  # [N, c]
    decided = k <= c  # top-k alone removes every token past the candidates
    if top_p is not None:
        # Normaliser: top-k's kept candidates where top-k decides the row, else the whole vocabulary, which is
        # right only without top-k: a top-k beyond the candidates renormalises over tokens not seen here, so such
        # rows are left undecided.
        log_norm = torch.where(decided, top.masked_fill(removed, float("-inf")).logsumexp(-1), logits.logsumexp(-1))
        probs = (top - log_norm.unsqueeze(-1)).exp().masked_fill(removed, 0)
        mass_before = probs.cumsum(-1) - probs
        p_on = top_p < 1
        removed |= (mass_before >= top_p.float().unsqueeze(-1)) & (ranks > 0) & p_on.unsqueeze(-1)
        decided |= p_on & (k >= vocab) & (probs.sum(-1) >= top_p)  # the first token past the candidates is cut
        nothing_on = ~p_on & (k >= vocab)
    else:
        nothing_on = k >= vocab
    lowest_kept = top.masked_fill(removed, float("inf")).amin(-1)  # [N]
    lowest_kept = torch.where(nothing_on, float("-inf"), lowest_kept)
    return lowest_kept, ~decided & ~nothing_on, top, ids
