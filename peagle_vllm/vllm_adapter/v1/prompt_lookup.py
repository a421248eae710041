"""Prompt and corpus lookup on the scheduler's side (`lookup.PromptLookup`, `corpus_lookup.CorpusLookup`, tried in
turn: `lookup.FirstFound`): each greedy request's drafts from this step's head forward get their first depths from
the request's own tokens, or from the corpus, where an n-gram match says what comes next.

Applied in `update_draft_token_ids` (`scheduler_hook`), after `update_from_output` appended the step's accepted
tokens to each request, and before adaptive depth cuts each request's drafts to its K. Synchronous scheduling
only: under async scheduling the drafts go from the worker to the next step without passing the scheduler."""

from __future__ import annotations

from peagle_vllm.lookup import FirstFound, TokenHistory, blend
from peagle_vllm.vllm_adapter.v1.scheduler_state import SAMPLING_EPS


def with_lookup(scheduler, lookup: FirstFound, history: TokenHistory, req_ids: list[str],
                drafts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """(drafts, looked up): each greedy request's drafts [K] with its looked-up continuation at the first depths
    (`lookup.blend`), the others' as they were; and per request, how many of its first drafts the lookup gave.
    `history` keeps each request's tokens as an array (forgotten when the request finishes: `scheduler_hook`)."""
    out, looked_up = [], []
    for rid, row in zip(req_ids, drafts):
        request = scheduler.requests.get(rid)
        params = getattr(request, "sampling_params", None)
        if params is None or params.temperature > SAMPLING_EPS or not len(row):
            out.append(row)
            looked_up.append(0)
            continue
        found = lookup.continuation(history.of(rid, request.all_token_ids), len(row))
        looked_up.append(len(found))
        out.append(blend(row, found) if len(found) else row)
    return out, looked_up
