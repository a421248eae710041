"""PEagleRejectionSampler: vLLM's RejectionSampler interface (`forward(metadata, draft_probs,
logits, sampling_metadata) -> SamplerOutput`) with our verification (`peagle_vllm.verify`).

Kept from vLLM: the bonus token from vLLM's own Sampler (so it honours every sampling option and
seed exactly as plain decoding does; on CPU its top-k/top-p and draw come from each row's candidates, `bonus_sampler`),
penalties/bad-words/min-tokens on the draft rows, logprobs and the output layout. Ours: the processed target
distribution (temperature, top-k, top-p in plain torch: no crash on CPU; on CPU from each row's most likely
tokens, `truncation`; vLLM itself refuses min_p requests under speculation) and greedy/token-wise/block
acceptance, lossless on CPU and GPU; opt-in lossy acceptance of greedy requests' drafts
(`verifier_accept_k` / `accept_tolerance`, `verify.within_tolerance`). On CPU, when every sampled row's
top-k/top-p keeps only its candidates and no request is seeded, verification runs over each row's candidates
(`on_candidates`, `candidate_vocab`) instead of the whole vocabulary. The [B, K] layout is built from
vLLM's device-side cu_num_draft_tokens: no host list is copied to the device per step.

Memory: vLLM sizes the sampler's memory by its profile run (`GPUModelRunner._dummy_sampler_run`), which calls
this sampler with one draft for each of `max_rows` requests. With K drafts, the draft rows' float32 logits and
target distributions are made `max_rows` rows at a time (`TargetChunks`; on CPU at least `CPU_ROWS`, as vLLM's CPU
worker sizes its KV cache from a setting, not from that run's peak) and draft_probs are read in place
(`DraftRows`), so no [B*K, V] float32 is held, unless vLLM's logits processors, logprobs or lossy acceptance
need every processed row at once (then, as in vLLM's own rejection sampler, [B*K, V] float32 is kept).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from vllm.v1.outputs import SamplerOutput
from vllm.v1.sample.logits_processor.builtin import MinTokensLogitsProcessor
from vllm.v1.sample.rejection_sampler import RejectionSampler
from vllm.v1.sample.sampler import Sampler

from peagle_vllm.candidate_vocab import CandidateRows, Slots, candidate_rows, widened
from peagle_vllm.truncation import WIDER, kept_candidates, truncation_on
from peagle_vllm.verify import is_lossy, scaled_logits, target_probs, verify
from peagle_vllm.vllm_adapter.v1.bonus_sampler import with_candidate_top_p


def _per_draft(x: torch.Tensor | None, num_draft: torch.Tensor, rows: int) -> torch.Tensor | None:
    """Per-request values [B] repeated for each of the request's draft rows [num_tokens]."""
    return None if x is None else x.repeat_interleave(num_draft, output_size=rows)


def _pad(flat: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Rows of a flat [num_tokens, ...] tensor gathered into index's shape ([B, K] or [B]) + [...]; invalid
    (padding) slots are 0."""
    out = flat[index.clamp(max=max(flat.shape[0] - 1, 0))]
    return out.masked_fill(~valid.view(*valid.shape, *([1] * (out.dim() - valid.dim()))), 0)


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """[N, V] logits -> [N] int64: each row's argmax, read in place (no float32 copy of the rows); float32 rows as
    vLLM's own greedy sampling reads them (on CPU its own kernel, float32 only), so drafts are checked against the
    token plain greedy decoding picks."""
    if logits.dtype != torch.float32:  # argmax is exact in any dtype
        return logits.argmax(-1)
    return Sampler.greedy_sample(logits).view(-1).long()


def _logits_processors_act(sampling_metadata) -> bool:
    """Whether vLLM's `RejectionSampler.apply_logits_processors` (0.32) changes the draft rows: penalties, allowed
    token ids, bad words, min-tokens or a thinking budget in use (host facts); when not, it returns them as given."""
    sm = sampling_metadata
    holder = getattr(sm, "thinking_budget_state_holder", None)
    min_tokens = any(isinstance(p, MinTokensLogitsProcessor) and p.min_toks
                     for p in sm.logitsprocs.non_argmax_invariant)
    return (not sm.no_penalties or bool(sm.bad_words_token_ids) or sm.allowed_token_ids_mask is not None
            or min_tokens or (holder is not None and holder.has_tracked_requests()))


CPU_ROWS = 64  # draft rows processed at once on CPU at least: one row at a time (c=1) pays each op's overhead K times


class DraftRows:
    """vLLM's flat draft_probs [num_tokens, V] as the padded [B, K, V] of a `verify.PositionDists`, read a piece
    at a time instead of copied whole. index, valid [B, K]: each slot's flat row, and whether it is a draft."""

    def __init__(self, flat: torch.Tensor, index: torch.Tensor, valid: torch.Tensor) -> None:
        self.flat, self.index, self.valid, self.vocab = flat, index, valid, flat.shape[-1]

    def position(self, i: int) -> torch.Tensor:
        return _pad(self.flat, self.index[:, i], self.valid[:, i])

    def at(self, cols: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(cols.shape[0], device=cols.device)
        return _pad(self.flat, self.index[rows, cols], self.valid[rows, cols])

    def of_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return self.flat[self.index.clamp(max=max(self.flat.shape[0] - 1, 0)), ids].masked_fill(~self.valid, 0)


class TargetChunks:
    """Target distributions as the padded [B, K, V] of a `verify.PositionDists`, made by `make` (flat row ids [n]
    -> [n, V]) for a chunk of positions at a time, at most `max_rows` rows (at least one position, B rows), the
    latest chunk kept; `at` serves its rows from that chunk when it holds every position, else makes them. index,
    valid [B, K]: each slot's flat row, and whether it is a draft (else 0)."""

    def __init__(self, make, index: torch.Tensor, valid: torch.Tensor, vocab: int, max_rows: int) -> None:
        b, k = index.shape
        self.make, self.index, self.valid, self.vocab = make, index, valid, vocab
        self.span = max(1, min(k, max_rows // max(b, 1)))  # positions per chunk
        self._start, self._chunk = -1, None

    def _made(self, index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:  # [B, n] -> [B, n, V]
        out = self.make(index.reshape(-1)).view(*index.shape, -1)
        return out.masked_fill_(~valid.unsqueeze(-1), 0)

    def _positions(self, start: int) -> torch.Tensor:  # [B, span, V] from position `start`
        if start != self._start:
            self._start, self._chunk = -1, None  # freed before the next one is made
            cols = slice(start, start + self.span)
            self._chunk, self._start = self._made(self.index[:, cols], self.valid[:, cols]), start
        return self._chunk

    def position(self, i: int) -> torch.Tensor:
        start = i - i % self.span
        return self._positions(start)[:, i - start]

    def at(self, cols: torch.Tensor) -> torch.Tensor:
        rows = torch.arange(cols.shape[0], device=cols.device)
        if self._start == 0 and self.span >= self.index.shape[1]:  # the chunk held has every position
            return self._chunk[rows, cols]
        self._start, self._chunk = -1, None
        return self._made(self.index[rows, cols].unsqueeze(1), self.valid[rows, cols].unsqueeze(1)).squeeze(1)

    def of_tokens(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.cat([self._positions(s).gather(2, ids[:, s:s + self.span].unsqueeze(2)).squeeze(2)
                          for s in range(0, ids.shape[1], self.span)], dim=1)


def on_candidates(processed_rows, options, rows: int, cap: int, vocab: int, greedy_rows: torch.Tensor,
                  draft_ids: torch.Tensor, draft_probs: torch.Tensor | None, candidates: int) -> CandidateRows | None:
    """Each draft row's target and draft distributions over its kept candidates (`candidate_vocab`); None where a
    sampled row has no top-k/top-p or its `WIDER` * `candidates` do not hold every token they keep (host reads).
    processed_rows: flat draft rows (a slice or ids) -> [n, V] logits; options: (temperature, top_k, top_p) [rows] or
    None; greedy_rows [rows]; draft_ids [rows]; draft_probs [rows, V] or None (one-hot drafts); `cap` rows at a time."""
    temp, top_k, top_p = options
    on = truncation_on(top_k, top_p, vocab)
    if on is None or not bool((on | greedy_rows).all()):  # a sampled row keeps every token
        return None

    def cut(r, c: int):  # flat draft rows (a slice or ids) -> `kept_candidates` of c candidates
        return kept_candidates(scaled_logits(processed_rows(r), temp[r]), None if top_k is None else top_k[r],
                               None if top_p is None else top_p[r], c)

    ids, kept, whole = (torch.cat(parts) for parts in zip(*(cut(slice(s, s + cap), candidates)
                                                             for s in range(0, rows, cap))))
    short = (~(whole | greedy_rows)).nonzero().squeeze(1)  # the host read
    if short.numel():  # sampled rows the candidates do not hold whole try `WIDER` times as many
        wide_ids, wide_kept, wide_whole = cut(short, WIDER * candidates)
        if not bool(wide_whole.all()):
            return None
        ids, kept = widened(ids, kept, wide_ids.shape[1])
        ids[short], kept[short] = wide_ids, wide_kept
    return candidate_rows(draft_ids, ids, kept.softmax(-1), draft_probs)


class PEagleRejectionSampler(RejectionSampler):
    def __init__(self, sampler, spec_config, device, verify_mode: str = "auto", verifier_accept_k: int = 1,
                 accept_tolerance: float = 0.0, max_rows: int | None = None,
                 top_p_candidates: int | None = None) -> None:
        """max_rows: the requests vLLM's profile run samples (min(max_num_batched_tokens, max_num_seqs)), the
        most draft rows processed at once (on CPU at least `CPU_ROWS`); None: one draft position (B rows) at a
        time. top_p_candidates: top-k/top-p from that many most likely tokens per row (`verify.target_probs`; it
        reads the device, so CPU only: `truncation.CPU_CANDIDATES`), and verification over them where they hold
        every kept token (`on_candidates`); None (GPU) sorts every row."""
        super().__init__(sampler, spec_config, device)
        self.verify_mode = verify_mode
        self.top_p_candidates = top_p_candidates
        self.max_rows = max_rows if top_p_candidates is None else max(max_rows or 0, CPU_ROWS)
        self.bonus_sampler = sampler if top_p_candidates is None else with_candidate_top_p(sampler, top_p_candidates)
        self.accept_k, self.accept_tolerance = verifier_accept_k, accept_tolerance
        self.lossy = is_lossy(verifier_accept_k, accept_tolerance)

    def forward(self, metadata, draft_probs, logits, sampling_metadata) -> SamplerOutput:
        k = metadata.max_spec_len
        if k == 0:  # no request has drafts (adaptive depth in fallback): plain decoding's sampling, same mask
            return self.bonus_sampler(logits=logits[metadata.bonus_logits_indices], sampling_metadata=sampling_metadata)
        b = len(metadata.num_draft_tokens)
        dev = logits.device
        logprobs = sampling_metadata.max_num_logprobs is not None
        bonus_out = self.bonus_sampler(  # full raw logits back ([B, V] float32) only when logprobs need them
            logits=logits[metadata.bonus_logits_indices],
            sampling_metadata=replace(sampling_metadata, max_num_logprobs=-1) if logprobs else sampling_metadata,
            predict_bonus_token=True,
            logprobs_mode_override="processed_logits" if self.is_processed_logprobs_mode else "raw_logits")
        bonus = bonus_out.sampled_token_ids.view(-1).long()
        rows = metadata.target_logits_indices.shape[0]  # flat draft rows
        # [B, K] layout of the flat draft rows, from the device's cumulative counts [B].
        ends = metadata.cu_num_draft_tokens.long()
        starts = torch.cat([ends.new_zeros(1), ends[:-1]])
        num_draft = ends - starts
        cols = torch.arange(k, device=dev)
        index = (starts.unsqueeze(1) + cols).clamp(max=max(rows - 1, 0))
        valid = cols < num_draft.unsqueeze(1)
        drafts = _pad(metadata.draft_token_ids.long(), index, valid)
        raw = processed = slots = None
        if logprobs or self.lossy or _logits_processors_act(sampling_metadata):  # every processed row at once
            raw = logits[metadata.target_logits_indices].to(torch.float32)
            # Processors edit in place; raw logits are needed again only for raw logprobs.
            keep_raw = logprobs and not self.is_processed_logprobs_mode
            processed = self.apply_logits_processors(raw.clone() if keep_raw else raw, sampling_metadata, metadata)

        def processed_rows(r) -> torch.Tensor:  # flat draft rows (ids [n] or a slice) -> [n, V] float32
            return processed[r] if processed is not None else logits[metadata.target_logits_indices[r]].float()

        cap = self.max_rows or b  # rows processed at once
        argmax = None if sampling_metadata.all_random else _pad(  # [B, K], read by greedy rows only
            greedy_tokens(processed) if processed is not None
            else greedy_tokens(logits)[metadata.target_logits_indices], index, valid)
        if sampling_metadata.all_greedy:
            is_greedy = torch.ones(b, dtype=torch.bool, device=dev)
            probs = q = None
        else:
            temp = sampling_metadata.temperature
            is_greedy = temp < 1e-5  # vLLM's own greedy threshold (_SAMPLING_EPS)
            options = [_per_draft(x, num_draft, rows) for x in (temp, sampling_metadata.top_k, sampling_metadata.top_p)]

            def make(r: torch.Tensor) -> torch.Tensor:  # flat draft rows [n] -> target distributions [n, V]
                return target_probs(processed_rows(r), *(None if x is None else x[r] for x in options),
                                    candidates=self.top_p_candidates)

            probs = TargetChunks(make, index, valid, logits.shape[-1], cap)
            q = None if draft_probs is None else DraftRows(draft_probs, index, valid)
            small = None
            if self.top_p_candidates is not None and not sampling_metadata.generators:  # CPU, unseeded
                small = on_candidates(processed_rows, options, rows, cap, logits.shape[-1],
                                      _per_draft(is_greedy, num_draft, rows), metadata.draft_token_ids.long(),
                                      draft_probs, self.top_p_candidates)
            if small is not None:  # [B, K, M] instead of [B, K, V]
                probs, q = _pad(small.p, index, valid), None if small.q is None else _pad(small.q, index, valid)
                slots = Slots(_pad(small.ids, index, valid), _pad(small.drafts, index, valid))
        target_logits = _pad(processed, index, valid) if self.lossy else None  # [B, K, V]
        result = verify(self.verify_mode, drafts, num_draft, q, probs, argmax, bonus, is_greedy,
                        sampling_metadata.generators, self.accept_k, self.accept_tolerance, target_logits, slots)
        output = result.tokens.to(torch.int32)
        logprobs_tensors = None
        if logprobs:
            logprobs_tensors = self._get_logprobs_tensors(
                sampling_metadata.max_num_logprobs, metadata, logits,
                processed if self.is_processed_logprobs_mode else raw,
                bonus_out.logprobs_tensors.logprobs, output)
        return SamplerOutput(sampled_token_ids=output, logprobs_tensors=logprobs_tensors)
