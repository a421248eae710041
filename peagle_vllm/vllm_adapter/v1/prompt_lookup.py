"""Prompt and corpus lookup on the scheduler's side (`lookup.PromptLookup`, `corpus_lookup.CorpusLookup`, tried in
turn: `lookup.FirstFound`): each request's drafts from this step's head forward are chained with what the
request's own tokens, or the corpus, say comes next (`lookup.chain`). Greedy requests check any draft against the
argmax; sampled ones verify a lookup's draft with a one-hot q (`scheduled_q`, in the worker), so both stay lossless.

Applied in `update_draft_token_ids` (`scheduler_hook`), after `update_from_output` appended the step's accepted
tokens to each request, and before adaptive depth cuts each request's drafts to its K. Synchronous scheduling
only: under async scheduling the drafts go from the worker to the next step without passing the scheduler."""

from __future__ import annotations

from peagle_vllm.lookup import FirstFound, TokenHistory, chain


def with_lookup(scheduler, lookup: FirstFound, history: TokenHistory, req_ids: list[str],
                drafts: list[list[int]], k: int) -> tuple[list[list[int]], list[list[bool]]]:
    """(drafts, by lookup): each request's head drafts [K_head] chained with its lookups up to k drafts
    (`lookup.chain`; a request gone or without drafts keeps them as they were); and per request, which of its
    drafts the lookups gave. `history` keeps each request's tokens as an array (forgotten when the request
    finishes: `scheduler_hook`)."""
    out, by_lookup = [], []
    for rid, row in zip(req_ids, drafts):
        request = scheduler.requests.get(rid)
        if request is None or not len(row):
            out.append(row)
            by_lookup.append([])
            continue
        row, given = chain(lookup, history.of(rid, request.all_token_ids), list(row), k)
        out.append(row)
        by_lookup.append(given)
    return out, by_lookup
