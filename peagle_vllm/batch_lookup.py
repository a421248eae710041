"""Prompt lookup for a whole batch on the device, in tensor ops only (no data read back to the host), for runners
whose drafts never pass a host-side scheduler (vLLM 0.34's V2 runner, `vllm_adapter/v2/speculator.py`).

Rules, the same as `lookup.PromptLookup`'s for one request: the longest suffix n-gram of a request's tokens
(min_n <= n <= max_n) that occurred earlier in them wins, at its latest earlier occurrence, and the tokens that
followed it are the drafts. `lookup_first` puts them at the first depths and keeps the head's drafts past them:
`lookup.chain` asked once (the lookup is not asked again past the head's drafts, which would take a scan a depth).
Where prompt lookup finds nothing, corpus lookup may (`corpus_table`, reading `last_tokens`; `first_found`).
"""

from __future__ import annotations

import torch


def prompt_lookup(token_ids: torch.Tensor,  # [R, L] every request slot's tokens (prompt and output), int
                  rows: torch.Tensor,  # [B] the batch's slots in token_ids, int64
                  lengths: torch.Tensor,  # [R] tokens held per slot
                  k: int, min_n: int, max_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(continuations [B, k] int64, found [B] int64): each request's up to k tokens that followed the latest
    earlier occurrence of its longest suffix n-gram (`lookup.PromptLookup.continuation`); found: how many, 0 where
    none occurred (a continuation stops at the request's last token); the slots past `found` hold 0."""
    tokens = token_ids[rows]  # [B, L] (a copy: B x L tokens, and each n-gram length compares that many)
    batch, width = tokens.shape
    size = lengths[rows].long().unsqueeze(1)  # [B, 1]
    # [1, L] where an earlier occurrence ends, in the score's int32: (n + 1) * (L + 1) fits while L < 32M (n <= 64)
    ends = torch.arange(width, device=tokens.device, dtype=torch.int32).unsqueeze(0)

    def suffix_token(back: int) -> torch.Tensor:  # [B, 1] the token `back` places before the end (1: the last)
        return tokens.gather(1, (size - back).clamp(min=0))

    # [B, L] occurrences of the suffix's last n tokens, narrowed in place as n grows (bool: a byte a token)
    match = (ends < size - 1) & (tokens == suffix_token(1))
    best = torch.zeros(batch, dtype=torch.int32, device=tokens.device)  # n * (L + 1) + end + 1; 0: none
    for n in range(1, max_n + 1):
        if n > 1:  # an occurrence ending at e needs the token n-1 places before e: none before position n-1
            match[:, : n - 1] = False
            match[:, n - 1:] &= (tokens[:, : width - n + 1] == suffix_token(n)) & (size >= n)
        if n >= min_n:
            score = torch.where(match, ends + (n * (width + 1) + 1), 0).amax(dim=1)
            best = torch.maximum(best, score)
    best = best.long()
    start = torch.where(best > 0, (best - 1) % (width + 1) + 1, 0)  # [B] the token after the occurrence
    found = torch.where((best > 0) & (size.squeeze(1) > min_n), (size.squeeze(1) - start).clamp(0, k), 0)
    depth = torch.arange(k, device=tokens.device).unsqueeze(0)  # [1, k]
    gathered = tokens.gather(1, (start.unsqueeze(1) + depth).clamp(max=width - 1))
    return torch.where(depth < found.unsqueeze(1), gathered.long(), 0), found


def last_tokens(token_ids: torch.Tensor,  # [R, L] every request slot's tokens (prompt and output), int
                rows: torch.Tensor,  # [B] the batch's slots in token_ids, int64
                lengths: torch.Tensor,  # [R] tokens held per slot
                n: int) -> torch.Tensor:
    """[B, n] int64: each request's last n tokens, nearest first; -1 past its first token."""
    back = lengths[rows].long().unsqueeze(1) - 1 - torch.arange(n, device=token_ids.device)  # [B, n] positions
    return torch.where(back >= 0, token_ids[rows].gather(1, back.clamp(min=0)).long(), -1)


def first_found(*lookups: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(continuations [B, k], found [B]) pairs, tried in turn (`lookup.FirstFound`) -> each request's first pair
    that found a continuation, or the last pair's (found 0)."""
    continuations, found = lookups[-1]
    for earlier, earlier_found in reversed(lookups[:-1]):
        use = earlier_found > 0
        continuations = torch.where(use.unsqueeze(1), earlier, continuations)
        found = torch.where(use, earlier_found, found)
    return continuations, found


def lookup_first(head_drafts: torch.Tensor,  # [B, k] the head's drafts, int64
                 continuations: torch.Tensor,  # [B, k] from `prompt_lookup`
                 found: torch.Tensor,  # [B]
                 use: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # [B] bool: requests that take lookups
    """(drafts [B, k], taken [B, k] bool: which the lookup gave): a used request's continuation at its first
    `found` depths, the head's drafts at the rest (the head's depth-d draft does not depend on the drafts before
    it); the other requests' drafts unchanged."""
    depth = torch.arange(head_drafts.shape[1], device=head_drafts.device).unsqueeze(0)
    taken = (depth < found.unsqueeze(1)) & use.unsqueeze(1)
    return torch.where(taken, continuations, head_drafts), taken
