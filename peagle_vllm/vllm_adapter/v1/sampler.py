"""PEagleRejectionSampler: vLLM's RejectionSampler interface (`forward(metadata, draft_probs,
logits, sampling_metadata) -> SamplerOutput`) with our verification (`peagle_vllm.verify`).

Kept from vLLM: the bonus token from vLLM's own Sampler (so it honours every sampling option and
seed exactly as plain decoding does), penalties/bad-words/min-tokens on the draft rows, logprobs
and the output layout. Ours: the processed target distribution (temperature, top-k, top-p in plain
torch: no crash on CPU; vLLM itself refuses min_p requests under speculation) and greedy/token-wise/
block acceptance, lossless on CPU and GPU; opt-in lossy acceptance of greedy requests' drafts
(`verifier_accept_k` / `accept_tolerance`, `verify.within_tolerance`). The [B, K] layout is built from
vLLM's device-side cu_num_draft_tokens: no host list is copied to the device per step.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.rejection_sampler import RejectionSampler

from peagle_vllm.verify import is_lossy, target_probs, verify


def _per_draft(x: torch.Tensor | None, num_draft: torch.Tensor, rows: int) -> torch.Tensor | None:
    """Per-request values [B] repeated for each of the request's draft rows [num_tokens]."""
    return None if x is None else x.repeat_interleave(num_draft, output_size=rows)


def _pad(flat: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Rows of a flat [num_tokens, ...] tensor gathered into [B, K, ...]; invalid (padding) slots are 0."""
    out = flat[index.clamp(max=max(flat.shape[0] - 1, 0))]
    return out.masked_fill(~valid.view(*valid.shape, *([1] * (out.dim() - 2))), 0)


class PEagleRejectionSampler(RejectionSampler):
    def __init__(self, sampler, spec_config, device, verify_mode: str = "auto", verifier_accept_k: int = 1,
                 accept_tolerance: float = 0.0) -> None:
        super().__init__(sampler, spec_config, device)
        self.verify_mode = verify_mode
        self.accept_k, self.accept_tolerance = verifier_accept_k, accept_tolerance
        self.lossy = is_lossy(verifier_accept_k, accept_tolerance)

    def forward(self, metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput:
        k = metadata.max_spec_len
        if k == 0:  # no request has drafts (adaptive depth in fallback): exactly plain decoding's sampling
            return self.sampler(logits=logits[metadata.bonus_logits_indices], sampling_metadata=sampling_metadata)
        b = len(metadata.num_draft_tokens)
        dev = logits.device
        bonus_out = self.sampler(
            logits=logits[metadata.bonus_logits_indices],
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1),
            predict_bonus_token=True,
            logprobs_mode_override="processed_logits" if self.is_processed_logprobs_mode else "raw_logits")
        bonus = bonus_out.sampled_token_ids.view(-1).long()
        raw = logits[metadata.target_logits_indices].to(torch.float32)
        # Processors edit in place; raw logits are needed again only for raw logprobs.
        keep_raw = sampling_metadata.max_num_logprobs is not None and not self.is_processed_logprobs_mode
        processed = self.apply_logits_processors(raw.clone() if keep_raw else raw, sampling_metadata, metadata)
        # [B, K] layout of the flat draft rows, from the device's cumulative counts [B].
        ends = metadata.cu_num_draft_tokens.long()
        starts = torch.cat([ends.new_zeros(1), ends[:-1]])
        num_draft = ends - starts
        cols = torch.arange(k, device=dev)
        index = starts.unsqueeze(1) + cols
        valid = cols < num_draft.unsqueeze(1)
        drafts = _pad(metadata.draft_token_ids.long(), index, valid)
        argmax = _pad(processed.argmax(-1), index, valid)
        if sampling_metadata.all_greedy:
            is_greedy = torch.ones(b, dtype=torch.bool, device=dev)
            probs = q = None
        else:
            temp = sampling_metadata.temperature
            is_greedy = temp < 1e-5  # vLLM's own greedy threshold (_SAMPLING_EPS)
            rows = processed.shape[0]
            probs = _pad(target_probs(processed, _per_draft(temp, num_draft, rows),
                                      _per_draft(sampling_metadata.top_k, num_draft, rows),
                                      _per_draft(sampling_metadata.top_p, num_draft, rows)), index, valid)
            q = None if draft_probs is None else _pad(draft_probs, index, valid)
        target_logits = _pad(processed, index, valid) if self.lossy else None  # [B, K, V]
        result = verify(self.verify_mode, drafts, num_draft, q, probs, argmax, bonus, is_greedy,
                        sampling_metadata.generators, self.accept_k, self.accept_tolerance, target_logits)
        output = result.tokens.to(torch.int32)
        logprobs = None
        if sampling_metadata.max_num_logprobs is not None:
            logprobs = self._get_logprobs_tensors(
                sampling_metadata.max_num_logprobs, metadata, logits,
                processed if self.is_processed_logprobs_mode else raw,
                bonus_out.logprobs_tensors.logprobs, output)
        return SamplerOutput(sampled_token_ids=output, logprobs_tensors=logprobs)
