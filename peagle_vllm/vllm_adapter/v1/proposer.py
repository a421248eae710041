"""PEagleProposer: replaces vLLM's EagleProposer for p_eagle (patched in by runner_hook).

It keeps vLLM's scheduler-side machinery for the K slots (lookahead slots, slot mapping,
attention metadata: `set_inputs_first_pass`), and owns what P-EAGLE decides: our head, its
per-depth mask states, ONE forward for all K drafts, and sampled drafts with their
probabilities so that verification at temperature > 0 stays lossless.
"""

from __future__ import annotations

import contextlib

import torch
from vllm.forward_context import set_forward_context
from vllm.v1.spec_decode.eagle import EagleProposer
from vllm.v1.spec_decode.utils import PADDING_SLOT_ID

from peagle_vllm.proposer import sample_drafts
from peagle_vllm.rollback import beyond_capacity
from peagle_vllm.timing import SectionTimer
from peagle_vllm.truncation import CPU_CANDIDATES
from peagle_vllm.vllm_adapter.log import logger
from peagle_vllm.vllm_adapter.v1.carriers import mark_of
from peagle_vllm.vllm_adapter.v1.draft_model import PEagleDraftModel



class PEagleProposer(EagleProposer):
    """Drafts K tokens per request in one head forward over [context ; K-1 mask slots]."""

    def __init__(self, vllm_config, device, runner=None) -> None:
        super().__init__(vllm_config, device, runner=runner)
        self.method = "p_eagle"
        self._runner = runner
        self.num_proposals = 0  # head forwards, one per engine step with speculation
        self.num_skipped = 0  # steps in which every request was in fallback: no draft ran
        self._mask_states: torch.Tensor | None = None
        self._draft_to_target: torch.Tensor | None = None  # [Vd] target id of each draft id, or None: same vocab
        self.last_drafts: torch.Tensor | None = None  # [B, K] of the latest step, target ids
        self._bad_rows = torch.zeros((), dtype=torch.long, device=device)
        self._warned_bad = False
        self.draft_timer = SectionTimer(device)  # time of each draft (inputs, head forward, sampling)
        # top-k/top-p of sampled drafts from the candidates where reading the device is free
        self._top_p_candidates = CPU_CANDIDATES if torch.device(device).type == "cpu" else None
        # the head drafts at most this deep, lookups past it (`head_depth`), where the scheduler sees the drafts
        # to cut their padding: under synchronous scheduling only, like the lookups
        head_depth = mark_of(vllm_config.speculative_config).options.head_depth
        self._head_depth = None if vllm_config.scheduler_config.async_scheduling else head_depth

    def load_model(self, target_model: torch.nn.Module) -> None:
        """Loads our head (vLLM's loader), then caches fc(mask_hidden) for the mask slots.
        The base class would flatten a per-depth mask_hidden into one vector: skip that part."""
        mask_buffer, self.parallel_drafting_hidden_state_tensor = self.parallel_drafting_hidden_state_tensor, None
        try:
            super().load_model(target_model)
        finally:
            self.parallel_drafting_hidden_state_tensor = mask_buffer
        if not isinstance(self.model, PEagleDraftModel):
            raise TypeError(f"p_eagle expected its own draft model, vLLM built {type(self.model).__name__}")
        with torch.inference_mode():
            self._mask_states = self.model.mask_states().to(self.dtype)
            # read once here: the model's property reads d2t back to the host (a device sync per step)
            self._draft_to_target = self.model.draft_to_target
        self.parallel_drafting_hidden_state_tensor.copy_(self._mask_states[0])

    def _sanitize(self, logits: torch.Tensor) -> torch.Tensor:
        """A broken head (NaN/Inf) must not change outputs: its rows become uniform drafts, which
        verification rejects or accepts losslessly like any other. Counted without a device sync;
        checked (and warned about, once) every 64 proposals. A row's float32 sum is finite iff all its logits
        are (NaN and +-Inf propagate; only logits near 1e38 overflow it, and those rows are as broken): one
        reduction instead of isfinite's passes over [B, K, Vd]. In place: the logits are this step's own."""
        bad = ~torch.isfinite(logits.sum(dim=-1, keepdim=True, dtype=torch.float32))
        self._bad_rows += bad.sum()
        if self.num_proposals % 64 == 1 and not self._warned_bad and self.num_bad_draft_rows:
            self._warned_bad = True
            logger.warning("p_eagle: the draft head produced NaN/Inf logits; those drafts are replaced by "
                           "uniform ones (outputs stay exact, acceptance drops). Check the head's weights.")
        return logits.masked_fill_(bad, 0.0)

    @property
    def num_bad_draft_rows(self) -> int:
        """Draft rows whose logits were NaN/Inf so far."""
        return int(self._bad_rows)

    def _drop_writes_beyond_reservation(self, cad, num_tokens: int, batch_size: int) -> None:
        """Adaptive depth reserves lookahead for each request's own K, so mask slots past a request's
        blocks have no slot of their own: their KV is not written (their drafts are cut anyway). The
        host's block counts reach the device by a non-blocking copy from pinned memory (no sync)."""
        table = self._runner.input_batch.block_table.block_tables[self.kv_cache_gid]
        capacity = torch.from_numpy(table.num_blocks_per_row[:batch_size].astype("int64")) * table.block_size
        if self.positions.is_cuda:  # a fresh pinned block: the caching host allocator keeps it until copied
            capacity = capacity.pin_memory()
        capacity = capacity.to(self.positions.device, non_blocking=True)
        per_request = cad.query_start_loc[1: batch_size + 1] - cad.query_start_loc[:batch_size]
        beyond = beyond_capacity(self.positions[:num_tokens], per_request, capacity)
        cad.slot_mapping[:num_tokens].masked_fill_(beyond, PADDING_SLOT_ID)

    def _draft_depth(self) -> int:
        """Drafts per request this step: under adaptive depth the most any scheduled request may
        get (sent by the scheduler), else K; at most `head_depth`, past which lookups draft. Depth 1 has no
        mask slots: plain EAGLE input. Depth 0: every request is in fallback, no draft runs (the head's KV then
        misses this step's tokens: the scheduler has them computed again when the request drafts next, see
        head_catch_up)."""
        depth = self._adaptive_depth()
        k = self.num_speculative_tokens if depth is None else min(depth, self.num_speculative_tokens)
        return k if self._head_depth is None else min(k, self._head_depth)

    def _adaptive_depth(self) -> int | None:
        """The scheduler's draft depth for this step; None when K is fixed (not adaptive)."""
        return getattr(self._runner, "peagle_draft_depth", None)

    @contextlib.contextmanager
    def _slot_layout(self, depth: int):
        """vLLM's input layout with `depth` slots per request instead of K (restored afterwards)."""
        saved = self.extra_slots_per_request, self.net_num_new_slots_per_request, self.needs_extra_input_slots
        self.extra_slots_per_request, self.net_num_new_slots_per_request = depth, depth - 1
        self.needs_extra_input_slots = depth > 1
        try:
            yield
        finally:
            self.extra_slots_per_request, self.net_num_new_slots_per_request, self.needs_extra_input_slots = saved

    @torch.inference_mode()
    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None) -> torch.Tensor:
        k = self._draft_depth()
        self._last_draft_probs = None
        batch_size = common_attn_metadata.batch_size()
        if k == 0:
            self.num_skipped += 1
            return torch.zeros((batch_size, self.num_speculative_tokens), dtype=torch.long, device=self.device)
        with self.draft_timer.section():
            drafts = self._draft(k, target_token_ids, target_positions, target_hidden_states, next_token_ids,
                                 token_indices_to_sample, common_attn_metadata, sampling_metadata,
                                 num_rejected_tokens_gpu)
        # vLLM's buffers are [B, K]: columns past this step's depth are never scheduled (capped).
        return drafts if k == self.num_speculative_tokens else torch.nn.functional.pad(
            drafts, (0, self.num_speculative_tokens - k))

    def _draft(self, k: int, target_token_ids, target_positions, target_hidden_states, next_token_ids,
               token_indices_to_sample, common_attn_metadata, sampling_metadata,
               num_rejected_tokens_gpu) -> torch.Tensor:
        """[B, k] drafts from one head forward over [context ; k-1 mask slots]."""
        batch_size = common_attn_metadata.batch_size()
        # [num_tokens, 3*Ht] -> [num_tokens, H]
        target_hidden_states = self.model.combine_hidden_states(target_hidden_states)
        with self._slot_layout(k):
            num_tokens, token_indices_to_sample, cad = self.set_inputs_first_pass(
                target_token_ids=target_token_ids, next_token_ids=next_token_ids, target_positions=target_positions,
                target_hidden_states=target_hidden_states, token_indices_to_sample=token_indices_to_sample,
                cad=common_attn_metadata, num_rejected_tokens_gpu=num_rejected_tokens_gpu)
        if self._adaptive_depth() is not None:  # fixed K: vLLM reserved K lookahead slots for every request
            self._drop_writes_beyond_reservation(cad, num_tokens, batch_size)
        # [B*K]: request r's column 0 is its last real token, column d its d-th mask slot.
        slots = token_indices_to_sample.long()
        if self._mask_states.shape[0] > 1 and k > 1:  # depth-aware head: one state per depth
            self.hidden_states[slots.view(batch_size, k)[:, 1:]] = self._mask_states[: k - 1].unsqueeze(0)
        _, per_layer_metadata = self.build_per_group_and_layer_attn_metadata(cad)
        cudagraph_mode, num_input_tokens, num_tokens_across_dp = self._determine_batch_execution_and_padding(num_tokens)
        model_kwargs, slot_mapping_size = self.build_model_inputs_first_pass(num_tokens, num_input_tokens, None)
        with set_forward_context(per_layer_metadata, self.vllm_config, num_tokens=num_input_tokens,
                                 num_tokens_across_dp=num_tokens_across_dp, cudagraph_runtime_mode=cudagraph_mode,
                                 slot_mapping=self._get_slot_mapping(slot_mapping_size, cad.slot_mapping)):
            # the sampled slots' rows only: [B*K, H] (the context tokens still write their KV)
            normed, _ = self.model(**model_kwargs, rows=slots)
        self.num_proposals += 1
        # [B*K, H] -> [B, K, Vd]
        logits = self.model.draft_logits(normed).view(batch_size, k, -1)
        logits = self._sanitize(logits)
        sm = sampling_metadata
        temperature, top_k, top_p = (None if sm.all_greedy or x is None else x[:batch_size]
                                     for x in (sm.temperature, sm.top_k, sm.top_p))
        if temperature is not None and self.model.draft_temperature != 1.0:  # greedy rows (T <= 0) stay greedy
            temperature = temperature * self.model.draft_temperature
        drafts, probs = sample_drafts(logits, self._draft_to_target, temperature, sm.generators,
                                      self.model.cfg.vocab_size, top_k, top_p, self._top_p_candidates)
        self._last_draft_probs = probs
        self.last_drafts = drafts
        return drafts
