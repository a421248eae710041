"""PEagleProposer: replaces vLLM's EagleProposer for p_eagle (patched in by runner_hook).

It keeps vLLM's scheduler-side machinery for the K slots (lookahead slots, slot mapping,
attention metadata: `set_inputs_first_pass`), and owns what P-EAGLE decides: our head, its
per-depth mask states, ONE forward for all K drafts, and sampled drafts with their
probabilities so that verification at temperature > 0 stays lossless.
"""

from __future__ import annotations

import logging

import torch
from vllm.forward_context import set_forward_context
from vllm.v1.spec_decode.eagle import EagleProposer

from peagle_vllm.proposer import sample_drafts
from peagle_vllm.vllm_adapter.draft_model import PEagleDraftModel

logger = logging.getLogger("peagle_vllm")


class PEagleProposer(EagleProposer):
    """Drafts K tokens per request in one head forward over [context ; K-1 mask slots]."""

    def __init__(self, vllm_config, device, runner=None) -> None:
        super().__init__(vllm_config, device, runner=runner)
        self.method = "p_eagle"
        self.num_proposals = 0  # propose() calls, one per engine step with speculation
        self._mask_states: torch.Tensor | None = None
        self.last_drafts: torch.Tensor | None = None  # [B, K] of the latest step, target ids
        self._bad_rows = torch.zeros((), dtype=torch.long, device=device)
        self._warned_bad = False

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
        self.parallel_drafting_hidden_state_tensor.copy_(self._mask_states[0])

    def _sanitize(self, logits: torch.Tensor) -> torch.Tensor:
        """A broken head (NaN/Inf) must not change outputs: its rows become uniform drafts, which
        verification rejects or accepts losslessly like any other. Counted without a device sync;
        checked (and warned about, once) every 64 proposals."""
        bad = ~torch.isfinite(logits).all(dim=-1, keepdim=True)
        self._bad_rows += bad.sum()
        if self.num_proposals % 64 == 1 and not self._warned_bad and self.num_bad_draft_rows:
            self._warned_bad = True
            logger.warning("p_eagle: the draft head produced NaN/Inf logits; those drafts are replaced by "
                           "uniform ones (outputs stay exact, acceptance drops). Check the head's weights.")
        return logits.masked_fill(bad, 0.0)

    @property
    def num_bad_draft_rows(self) -> int:
        """Draft rows whose logits were NaN/Inf so far."""
        return int(self._bad_rows)

    @torch.inference_mode()
    def propose(self, num_speculative_tokens, target_token_ids, target_positions, target_hidden_states,
                next_token_ids, token_indices_to_sample, common_attn_metadata, sampling_metadata,
                mm_embed_inputs=None, num_rejected_tokens_gpu=None, slot_mappings=None) -> torch.Tensor:
        k = self.num_speculative_tokens
        self._last_draft_probs = None
        batch_size = common_attn_metadata.batch_size()
        # [num_tokens, 3*Ht] -> [num_tokens, H]
        target_hidden_states = self.model.combine_hidden_states(target_hidden_states)
        num_tokens, token_indices_to_sample, cad = self.set_inputs_first_pass(
            target_token_ids=target_token_ids, next_token_ids=next_token_ids, target_positions=target_positions,
            target_hidden_states=target_hidden_states, token_indices_to_sample=token_indices_to_sample,
            cad=common_attn_metadata, num_rejected_tokens_gpu=num_rejected_tokens_gpu)
        # [B, K]: column 0 is the last real token, column d the d-th mask slot.
        slots = token_indices_to_sample.view(batch_size, k).long()
        if self._mask_states.shape[0] > 1 and k > 1:  # depth-aware head: one state per depth
            self.hidden_states[slots[:, 1:]] = self._mask_states[: k - 1].unsqueeze(0)
        _, per_layer_metadata = self.build_per_group_and_layer_attn_metadata(cad)
        cudagraph_mode, num_input_tokens, num_tokens_across_dp = self._determine_batch_execution_and_padding(num_tokens)
        model_kwargs, slot_mapping_size = self.build_model_inputs_first_pass(num_tokens, num_input_tokens, None)
        with set_forward_context(per_layer_metadata, self.vllm_config, num_tokens=num_input_tokens,
                                 num_tokens_across_dp=num_tokens_across_dp, cudagraph_runtime_mode=cudagraph_mode,
                                 slot_mapping=self._get_slot_mapping(slot_mapping_size, cad.slot_mapping)):
            normed, _ = self.model(**model_kwargs)
        self.num_proposals += 1
        # [B*K, H] -> [B, K, Vd]
        logits = self.model.draft_logits(normed[slots.reshape(-1)]).view(batch_size, k, -1)
        logits = self._sanitize(logits)
        temperature = None if sampling_metadata.all_greedy else sampling_metadata.temperature[:batch_size]
        drafts, probs = sample_drafts(logits, self.model.draft_to_target, temperature,
                                      sampling_metadata.generators, self.model.cfg.vocab_size)
        self._last_draft_probs = probs
        self.last_drafts = drafts
        return drafts
