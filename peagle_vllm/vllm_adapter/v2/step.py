"""One P-EAGLE draft step on plain tensors: fc, row layout, context K/V, the ONE query forward, drafts.

`PEagleSpeculator.propose` runs it with vLLM's runtime around it (`store_context` writes the paged draft KV
cache, `run_query` sets the forward context and attention metadata); tests run the very same function on CPU
with a plain attention over the same K/V. Shapes: B requests, N target rows, K drafts, H draft hidden size.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from peagle_vllm.vllm_adapter.v2 import drafts, layout


@dataclass
class StepInputs:
    target_input_ids: torch.Tensor  # [N]
    positions: torch.Tensor  # [N]
    query_start_loc: torch.Tensor  # [B+1]
    aux_hidden: torch.Tensor  # [N, num_aux*Ht] concatenated target auxiliary states
    num_sampled: torch.Tensor  # [B] 0 while a request is still prefilling
    num_rejected: torch.Tensor  # [B]
    idx_mapping: torch.Tensor  # [B] request-state slot of each batch row
    last_sampled: torch.Tensor  # [max_reqs]
    next_prefill_tokens: torch.Tensor  # [max_reqs] or [lookahead, max_reqs]
    temperature: torch.Tensor  # [max_reqs]
    top_k: torch.Tensor | None = None  # [max_reqs]; None: no request of the batch uses top-k
    top_p: torch.Tensor | None = None  # [max_reqs]; None: no request of the batch uses top-p


@dataclass
class DraftStep:
    tokens: torch.Tensor  # [B, K] target ids
    rounded_logits: torch.Tensor  # [B, K, Vd] in the cache's dtype: what sampled drafts were drawn from and the
    # verifier rebuilds q from (softmax(rounded.float() / T), `drafts.draft_probs`)
    num_bad_rows: torch.Tensor  # [] rows whose logits were NaN/Inf (drafted uniformly)
    context: layout.ContextRows
    query: layout.QueryRows


StoreContext = Callable[[layout.ContextRows, torch.Tensor], None]  # (rows, fc-combined hidden [N, H])
RunQuery = Callable[[layout.QueryRows, torch.Tensor], torch.Tensor]  # (rows, hidden [B*K, H]) -> normed [B*K, H]


def draft_step(model, mask_states: torch.Tensor, draft_to_target: torch.Tensor | None, inputs: StepInputs, k: int,
               max_model_len: int, cache_dtype: torch.dtype, store_context: StoreContext,
               run_query: RunQuery, draft_temperature: float = 1.0) -> DraftStep:
    """K drafts per request from ONE call of `run_query`, with no read of device data to the host.
    mask_states [>=K-1, H] (fc of the learned mask states) and draft_to_target [Vd] or None are the head's
    constants, taken once after loading (`model.draft_to_target` reads d2t to the host, so not per step).
    `store_context` runs before `run_query` (the query attends to the stored context). The logits are divided by
    `draft_temperature` (`peagle_vllm.draft_temperature`) before drafting and caching: vLLM's rejection kernel
    divides the cached logits by the request's T, so q is softmax(logits / (T x draft_temperature)) there too."""
    b = inputs.num_rejected.shape[0]
    hidden = model.combine_hidden_states(inputs.aux_hidden)  # [N, H]
    bonus = layout.bonus_tokens(inputs.num_sampled, inputs.idx_mapping, inputs.last_sampled,
                                inputs.next_prefill_tokens)
    context = layout.context_rows(inputs.target_input_ids, inputs.query_start_loc, inputs.num_rejected, bonus)
    store_context(context, hidden)
    query = layout.query_rows(inputs.positions, context.last, bonus, k, model.cfg.mask_token_id, max_model_len)
    normed = run_query(query, layout.query_hidden(hidden, context.last, mask_states, k))
    logits = model.draft_logits(normed).view(b, k, -1)  # [B, K, Vd]
    if draft_temperature != 1.0:  # a greedy row's argmax is unchanged
        logits = logits / draft_temperature
    per_request = (lambda x: None if x is None else x[inputs.idx_mapping])
    tokens, rounded, bad = drafts.draft_block(logits, draft_to_target, inputs.temperature[inputs.idx_mapping],
                                              cache_dtype, per_request(inputs.top_k), per_request(inputs.top_p))
    return DraftStep(tokens, rounded, bad, context, query)
