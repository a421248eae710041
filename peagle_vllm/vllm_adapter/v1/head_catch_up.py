"""Catch-up of the draft head's KV after steps that ran no draft (adaptive depth's fallback).

A step with every request in fallback runs no draft (depth 0), so the head's KV has nothing for the
tokens decoded, or prompt tokens prefilled, in it, and the head's later drafts attend to those slots.
Measured on the demo head (32 prompts, K=4, 50 steps forced plain): the next 40 tokens' acceptance
length was 1.87 against 2.16 without the gap, 1.96 with the last 16 tokens of the gap computed again
and 2.06 with all 50. So when a request is about to draft again, the scheduler moves its
`num_computed_tokens` back over the last tokens of its gap (as vLLM itself does for rejected drafts,
and for a whole request after preemption): the target computes them again, writing the same KV,
and the head, fed their hidden states like a prompt chunk's, writes its own. It costs a longer
step (64 tokens at batch 1: about two plain steps here), hence the limits per request and per step.
Tokens of blocks the prefix cache holds (possibly shared with other requests) are never computed
again, nor prompt tokens of a request that asked for prompt logprobs, nor requests with encoder
inputs or under a KV connector.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

CATCH_UP_TOKENS = 64  # most tokens of one request's gap computed again
CATCH_UP_BUDGET = 64  # most tokens computed again in one step, shared by the requests catching up


class HeadGaps:
    """Per request, tokens computed since the draft head last ran over it."""

    def __init__(self, limit: int = CATCH_UP_TOKENS, budget: int = CATCH_UP_BUDGET) -> None:
        self.limit, self.budget = limit, budget
        self.tokens: dict[str, int] = {}
        self.caught_up = 0  # tokens computed again so far (reported in the depth log line)

    def note_step(self, num_scheduled_tokens: dict[str, int], drafted: bool) -> None:
        """After a step: the head ran over every scheduled request's tokens when a draft ran, else
        each request's gap grew by its scheduled tokens."""
        for rid, n in num_scheduled_tokens.items():
            if drafted:
                self.tokens.pop(rid, None)
            else:
                self.tokens[rid] = self.tokens.get(rid, 0) + n

    def note_held(self, req_ids: Collection[str], steps: int) -> None:
        """After `steps` plain decode steps of these requests (held in fallback, see `depth.FallbackHold`): each
        one's gap grew by a token a step."""
        for rid in req_ids:
            self.tokens[rid] = self.tokens.get(rid, 0) + steps

    def forget(self, req_id: str) -> None:
        self.tokens.pop(req_id, None)

    def rewind(self, scheduler, will_draft: Callable[[str], bool]) -> None:
        """Before scheduling: each running request with a gap that will draft this step computes up to
        `limit` tokens of it again, `budget` tokens in all. Its gap is then settled: the step computes
        those tokens whenever the request is scheduled (a request left out of this step must not move
        back again), and a step that runs no draft counts them as a gap once more (`note_step`)."""
        if not self.tokens or not self.limit or getattr(scheduler, "connector", None) is not None:
            return
        managers = scheduler.kv_cache_manager.coordinator.single_type_managers
        catching_up = [r for r in scheduler.running if self.tokens.get(r.request_id) and not r.has_encoder_inputs
                       and not r.spec_token_ids and will_draft(r.request_id)]
        each = min(self.limit, max(self.budget // max(len(catching_up), 1), 1))
        for request in catching_up:
            floor = max((m.num_cached_block.get(request.request_id, 0) * m.block_size for m in managers), default=0)
            if request.sampling_params is not None and request.sampling_params.prompt_logprobs is not None:
                floor = max(floor, request.num_prompt_tokens)
            back = min(self.tokens.pop(request.request_id), each, request.num_computed_tokens - max(floor, 1))
            if back > 0:
                request.num_computed_tokens -= back
                self.caught_up += back
