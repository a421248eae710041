"""`PEagleSpeculator`: P-EAGLE on vLLM 0.34's V2 model runner. Drafts K tokens per request in ONE head forward
(a head of more than one layer adds a forward over the context rows first).

Each step, after the target verified the previous block (`propose` runs `step.draft_step`; `layout` has the rows):
1. fc(target auxiliary hidden states) for every target row;
2. the context rows' draft K/V go into the draft KV cache: without attention for a 1-layer head (a row's K/V
   depend on its own input only; rejected rows store nothing), by a forward over the target batch's rows for a
   deeper head (its later layers' K/V depend on attention; see `_context_forward`);
3. ONE forward over K query rows per request -- depth 0 = (bonus token, fc(h_P)) at P, depths 1..K-1 = (mask
   token, learned mask state of that depth) at P+1..P+K-1 -- attending to the cached context causally;
4. drafts from the K rows (`drafts`): argmax for greedy requests, sampled with their q (cut by the request's
   top-k/top-p) for the others (chosen on the device: nothing in a step reads device data back to the host),
   and the draft logits cached for the verifier.

Verification is vLLM 0.34's own `RejectionSampler` (Triton kernels), set up by `PEagleSpeculatorConfig`:
greedy requests by argmax match, sampled requests token-wise (Leviathan et al., `rejection_sample_method=
"standard"` with the cached draft logits) or by block verification (Sun et al., `"block"`, for
`verify: "block"`). Both are the same tests as the core's `peagle_vllm.verify.verify_standard` /
`verify_block` (min(1, p/q), residual max(p - q, 0); the block rule's h_i), so nothing `verify` offers is
missing from V2's and the core's verifier does not run here (V2 also gives a speculator no way to replace the
runner's rejection sampler). Lossless as long as the cached logits are the ones the drafts were drawn from:
`drafts` rounds them to the cache's dtype before sampling.

With `prompt_lookup_max` set, a request's drafts come from its own text where it repeats, and with `lookup_corpus`
from the corpus where its text does not (`batch_lookup`, `corpus_table`: on the device, from the runner's token
history); the head's drafts follow them. A looked-up draft's cached row is one-hot, so sampled requests verify it
losslessly too.

Reused from V2: `DraftModelSpeculator` (buffers, draft KV groups, `DraftLogitsCache`, attention-metadata
building over the draft's block tables), `get_model` with our registered architecture, vLLM's embedding
sharing. Ours: the row layout, context K/V, the mask states, sampling. Not done on V2:
- CUDA graphs: the draft runs eagerly (`init_cudagraph_manager` / `capture` do nothing);
- per-request adaptive depth: `propose` gets one `num_speculative_tokens` for the whole batch (vLLM's
  batch-size schedule, `num_speculative_tokens_per_batch_size`, which p_eagle follows: it drafts only that
  many); the scheduler reserves the same lookahead for every request, and there is no hook through which a
  speculator sets each request's K or skips the target's work for a request.
- metrics: see `metrics` (log lines only; V2 has no channel from a speculator to /metrics).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
from vllm.config import VllmConfig
from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import BatchDescriptor, set_forward_context
from vllm.v1.worker.gpu.attn_utils import build_slot_mappings_by_layer
from vllm.v1.worker.gpu.cudagraph_utils import BatchExecutionDescriptor
from vllm.v1.worker.gpu.input_batch import InputBatch
from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

from peagle_vllm import batch_lookup
from peagle_vllm.corpus_lookup import CorpusLookup, read_answers
from peagle_vllm.corpus_table import CorpusTable
from peagle_vllm.vllm_adapter.log import LOGGER_NAME
from peagle_vllm.vllm_adapter.v2 import drafts, layout
from peagle_vllm.vllm_adapter.v2.config import options_of
from peagle_vllm.vllm_adapter.v2.draft_model import PEagleDraftModel
from peagle_vllm.vllm_adapter.v2.hf_config import head_of
from peagle_vllm.vllm_adapter.v2.metrics import VerificationCounts
from peagle_vllm.vllm_adapter.v2.step import StepInputs, draft_step

logger = logging.getLogger(LOGGER_NAME)


class PEagleSpeculator(DraftModelSpeculator):
    def __init__(self, vllm_config: VllmConfig, device: torch.device):
        super().__init__(vllm_config, device)
        self.options = options_of(self.speculative_config)
        self.head = head_of(self.draft_model_config.hf_config)
        self.draft_temperature = self.options.draft_temperature_for(self.head)  # sampled drafts at T x this
        self.k = self.num_speculative_steps
        self.num_query_per_req = self.k  # rows per request in the draft pass
        self.metrics = VerificationCounts(self.k, device, self.options.acceptance_warn_below)
        self.num_bad_rows = torch.zeros((), dtype=torch.long, device=device)
        self.num_proposals = 0  # head forwards: one per step that drafts
        self._mask_states: torch.Tensor | None = None  # [K-1, H]
        self._draft_to_target: torch.Tensor | None = None  # [Vd] (None: the head drafts over the target vocabulary)
        self._layer_name: str | None = None
        self._group_id = -1
        self._cut: tuple[torch.Tensor | None, torch.Tensor | None] = (None, None)  # top_k, top_p [max_reqs]
        self.lookup = self.options.prompt_lookup  # drafts from each request's own text too; None: off
        self.corpus = _corpus_table(self.options.lookup_corpus, device)  # ... and from answers the target wrote
        self._history = None  # the runner's RequestState: each request slot's tokens (the lookups read them)

    # --- loading -----------------------------------------------------------------------------------------

    def load_draft_model(self, target_model: nn.Module, target_attn_layer_names: set[str]) -> nn.Module:
        from vllm.config import replace
        from vllm.model_executor.model_loader import get_model
        from vllm.model_executor.model_loader.utils import get_draft_load_config
        from vllm.v1.worker.gpu.spec_decode.eagle.utils import maybe_share_target_embed
        from vllm.v1.worker.gpu.spec_decode.utils import get_pp_safe_draft_load_config

        config = self.speculative_config.apply_draft_overrides(self.vllm_config)
        load_config = get_pp_safe_draft_load_config(get_draft_load_config(config))
        if load_config is not config.load_config:
            config = replace(config, load_config=load_config)
        model = get_model(vllm_config=config, model_config=self.draft_model_config)
        if not isinstance(model, PEagleDraftModel):
            raise TypeError(f"p_eagle expected its own draft model, vLLM built {type(model).__name__}")
        language = target_model.get_language_model() if hasattr(target_model, "get_language_model") else target_model
        maybe_share_target_embed(model, model.model, getattr(language, "model", language))
        return model

    def load_model(self, target_model: nn.Module) -> None:
        super().load_model(target_model)
        self._prepare_head()
        self._layer_name = self.model.model.layers[0].self_attn.attn.layer_name

    def _prepare_head(self) -> None:
        """The loaded head's per-step constants, taken once so that no step reads them: the mask states and the
        draft -> target id map (`draft_to_target` reads d2t back to the host: a device sync)."""
        with torch.inference_mode():
            self._mask_states = self.model.mask_states(max(self.k - 1, 1)).to(self.dtype)
        self._draft_to_target = self.model.draft_to_target

    def set_attn(self, model_state, kv_cache_config, block_tables, target_input_buffers, target_attn_groups) -> None:
        super().set_attn(model_state, kv_cache_config, block_tables, target_input_buffers, target_attn_groups)
        self._group_id = next(gid for gid, group in enumerate(kv_cache_config.kv_cache_groups)
                              if self._layer_name in group.layer_names)
        outside = self.draft_attn_layer_names - set(kv_cache_config.kv_cache_groups[self._group_id].layer_names)
        if outside:  # the query pass sets one group's slot mappings
            raise RuntimeError(f"p_eagle needs every draft layer in one KV cache group; {sorted(outside)} are not "
                               f"in {self._layer_name}'s")

    # --- CUDA graphs: none, the draft runs eagerly -----------------------------------------------------------

    def init_cudagraph_manager(self, cudagraph_mode: CUDAGraphMode) -> None:
        if cudagraph_mode != CUDAGraphMode.NONE:
            logger.info("p_eagle: the draft head runs eagerly on vLLM 0.34 (no draft CUDA graphs)")

    def capture(self) -> None:
        return

    # --- per step ------------------------------------------------------------------------------------------

    def observe_verification(self, idx_mapping: torch.Tensor, num_sampled: torch.Tensor,
                             num_rejected: torch.Tensor) -> None:
        super().observe_verification(idx_mapping, num_sampled, num_rejected)
        b = idx_mapping.shape[0]
        self.metrics.observe(num_sampled[:b], num_rejected[:b])

    def prepare_propose(self, input_batch: InputBatch, num_sampled: torch.Tensor, num_rejected: torch.Tensor,
                        sampler) -> None:
        """vLLM's per-step work, then the requests' top-k/top-p for this step's sampled drafts: the runner's
        sampling states (device tensors by request slot), each None when no request of the batch uses it (read
        from the states' host copies, as vLLM's sampler does: no device sync)."""
        super().prepare_propose(input_batch, num_sampled, num_rejected, sampler)
        self._history = getattr(sampler, "req_states", None)
        states = getattr(sampler, "sampling_states", None)
        if states is None:
            self._cut = (None, None)
            return
        rows = input_batch.idx_mapping_np
        uses_top_k = bool((states.top_k.np[rows] != states.vocab_size).any())
        uses_top_p = bool((states.top_p.np[rows] != 1.0).any())
        self._cut = (states.top_k.gpu if uses_top_k else None, states.top_p.gpu if uses_top_p else None)

    @torch.inference_mode()
    def propose(self, input_batch: InputBatch, attn_metadata: dict[str, Any], slot_mappings: dict[str, torch.Tensor],
                last_hidden_states: torch.Tensor,  # [num_tokens, hidden_size]
                aux_hidden_states: list[torch.Tensor] | None,  # num_aux x [num_tokens, target_hidden_size]
                num_sampled: torch.Tensor,  # [num_reqs]
                num_rejected: torch.Tensor,  # [num_reqs]
                last_sampled: torch.Tensor,  # [max_num_reqs]
                next_prefill_tokens: torch.Tensor,  # [num_prefill_lookahead, max_num_reqs]
                temperature: torch.Tensor,  # [max_num_reqs]
                seeds: torch.Tensor,  # [max_num_reqs]
                dp_sync_state=None, dummy_run: bool = False, skip_attn_for_dummy_run: bool = False,
                mm_inputs=None, is_profile: bool = False,
                num_speculative_tokens: int | None = None) -> torch.Tensor:
        """[num_reqs, K] drafts (target ids) from one head forward; see the module docstring. When the scheduler
        asks for k < K drafts (vLLM's batch-size schedule, `num_speculative_tokens_per_batch_size`), the query pass
        runs k rows per request and drafts k, the rest -1. Dummy runs (profiling, warm-up) run the same computation
        without attention metadata and write nothing."""
        b, n = input_batch.num_reqs, input_batch.num_tokens
        k = self.k if num_speculative_tokens is None else min(num_speculative_tokens, self.k)
        aux = torch.cat([h[:n] for h in aux_hidden_states], dim=-1) if aux_hidden_states else last_hidden_states[:n]
        inputs = StepInputs(input_batch.input_ids[:n], input_batch.positions[:n], input_batch.query_start_loc[: b + 1],
                            aux, num_sampled[:b], num_rejected[:b], input_batch.idx_mapping[:b], last_sampled,
                            next_prefill_tokens, temperature, *self._cut)
        writes = not dummy_run
        one_layer = len(self.model.model.layers) == 1

        def store_context(context: layout.ContextRows, hidden: torch.Tensor, include_last: bool = False) -> None:
            if not one_layer:  # in dummy runs too: the profile then counts the context pass
                self._context_forward(input_batch, attn_metadata if writes else None, slot_mappings, context,
                                      inputs.positions, hidden)
            elif writes:
                self._store_context(context, inputs.positions, hidden, slot_mappings, include_last)

        if k == 0:  # no drafts this step: keep the draft KV in step (all valid rows)
            hidden = self.model.combine_hidden_states(aux)
            bonus = layout.bonus_tokens(inputs.num_sampled, inputs.idx_mapping, last_sampled, next_prefill_tokens)
            store_context(layout.context_rows(inputs.target_input_ids, inputs.query_start_loc, inputs.num_rejected,
                                              bonus), hidden, include_last=True)
            self.draft_tokens[:b].fill_(-1)
            return self.draft_tokens[:b]

        def run_query(query: layout.QueryRows, hidden: torch.Tensor) -> torch.Tensor:
            metadata, slots = self._query_attention(input_batch, query, k) if writes else (None, None)
            with set_forward_context(metadata, self.vllm_config, num_tokens=b * k, slot_mapping=slots,
                                     cudagraph_runtime_mode=CUDAGraphMode.NONE,
                                     batch_descriptor=BatchDescriptor(num_tokens=b * k)):
                normed, _ = self.model(query.input_ids, query.positions, hidden)
            return normed

        cache = self.draft_logits
        step = draft_step(self.model, self._mask_states, self._draft_to_target, inputs, k, self.max_model_len,
                          cache.values.dtype if cache is not None else self.dtype, store_context, run_query,
                          self.draft_temperature)
        self.num_proposals += 1
        self.num_bad_rows += step.num_bad_rows
        tokens, looked_up = step.tokens, None
        if (self.lookup is not None or self.corpus is not None) and self._history is not None and writes:
            tokens, looked_up = self._with_lookups(tokens, inputs)
        if cache is not None and writes:
            drafts.cache_draft_logits(cache.values, inputs.idx_mapping, step.rounded_logits, self._draft_to_target,
                                      looked_up, tokens)
        self.draft_tokens[:b, :k] = tokens
        self.draft_tokens[:b, k:] = -1
        return self.draft_tokens[:b]

    def _with_lookups(self, head_drafts: torch.Tensor,  # [num_reqs, k] target ids
                      inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """([num_reqs, k] drafts, [num_reqs, k] bool: which a lookup gave): a request's prompt-lookup continuation,
        else its corpus walk, at its first depths, the head's drafts past them (`batch_lookup`), greedy and sampled
        requests alike (the cache then holds a one-hot row for each looked-up draft: `drafts`); requests still in
        prefill keep the head's. The runner wrote this step's sampled tokens into the token history before
        `propose`."""
        tokens, lengths = self._history.all_token_ids.gpu, self._history.total_len.gpu  # [R, L], [R]
        rows, k = inputs.idx_mapping, head_drafts.shape[1]
        tried = []  # (continuations [num_reqs, k], found [num_reqs]) of each lookup, in the order they are tried
        if self.lookup is not None:
            tried.append(batch_lookup.prompt_lookup(tokens, rows, lengths, k, self.lookup.min_n, self.lookup.max_n))
        if self.corpus is not None:
            tail = batch_lookup.last_tokens(tokens, rows, lengths, self.corpus.max_n)  # [num_reqs, max_n]
            tried.append(self.corpus.continuation(tail, k))
        continuations, found = batch_lookup.first_found(*tried)
        drafts, taken = batch_lookup.lookup_first(head_drafts, continuations, found, inputs.num_sampled > 0)
        self.metrics.count_lookup(taken)
        return drafts, taken

    def _store_context(self, context: layout.ContextRows, positions: torch.Tensor, hidden: torch.Tensor,
                       slot_mappings: dict[str, torch.Tensor], include_last: bool) -> None:
        """Draft K/V of the context rows into the draft KV cache, at the target batch's slots for the draft group
        (read before `_query_attention` overwrites that buffer with the query rows' slots)."""
        n = positions.shape[0]
        store = context.store.clone()
        if include_last:
            store[context.last] = True
        slots = torch.where(store, slot_mappings[self._layer_name][:n].long(), layout.PAD_SLOT_ID)
        key, value = self.model.context_kv(context.input_ids, positions, hidden)
        self.model.store_context_kv(key, value, slots)

    def _context_forward(self, input_batch: InputBatch, attn_metadata: dict[str, Any] | None,
                         slot_mappings: dict[str, torch.Tensor], context: layout.ContextRows,
                         positions: torch.Tensor,  # [N]
                         hidden: torch.Tensor) -> None:  # [N, H] fc-combined
        """Every layer's draft K/V of the target batch's rows, written by a forward over them with the target
        batch's attention layout (a deeper head's layer-l K/V depend on attention in layer l-1). Rejected rows
        write too, at positions the query pass overwrites (P+1..P+K-1) or does not read (P+K) before the next
        step's context rows overwrite them. attn_metadata None (dummy runs): no attention, nothing written."""
        n = positions.shape[0]
        metadata, slots = (self._build_drafter_attn_metadata(input_batch, attn_metadata, slot_mappings)
                           if attn_metadata is not None else (None, None))
        with set_forward_context(metadata, self.vllm_config, num_tokens=n, slot_mapping=slots,
                                 cudagraph_runtime_mode=CUDAGraphMode.NONE,
                                 batch_descriptor=BatchDescriptor(num_tokens=n)):
            self.model(context.input_ids, positions, hidden)

    def _query_attention(self, input_batch: InputBatch, query: layout.QueryRows, k: int) -> tuple[Any, dict]:
        """Attention metadata and slot mappings of the query pass (k rows per request, causal over the cache)."""
        b = input_batch.num_reqs
        num_q = b * k
        buffers = self.input_buffers
        buffers.input_ids[:num_q] = query.input_ids
        buffers.positions[:num_q] = query.positions
        buffers.query_start_loc[: b + 1] = torch.arange(b + 1, device=self.device, dtype=torch.int32) * k
        buffers.query_start_loc[b + 1:] = num_q
        buffers.seq_lens[:b] = query.seq_lens
        buffers.seq_lens[b:] = 0
        gid = self._group_id
        self.block_tables.slot_mappings[gid, :num_q] = layout.query_slots(
            query.raw_positions, self.block_tables.input_block_tables[gid], self.block_tables.block_sizes[gid], k,
            self.max_model_len)
        max_seq_len = int(input_batch.seq_lens_cpu_upper_bound[:b].max())  # a host (numpy-backed) tensor: no sync
        self.draft_max_seq_len = min(max_seq_len + k, self.max_model_len)
        batch = BatchExecutionDescriptor(cg_mode=CUDAGraphMode.NONE, num_tokens=num_q, num_reqs=b)
        metadata = self._build_uniform_attn_metadata(batch, b, k, input_batch.seq_lens_cpu_upper_bound, step=k,
                                                     causal=True)
        slots = build_slot_mappings_by_layer(self.block_tables.slot_mappings[:, :num_q], self.kv_cache_config)
        return metadata, slots

    @property
    def num_bad_draft_rows(self) -> int:
        """Draft rows whose logits were NaN/Inf so far (one sync)."""
        return int(self.num_bad_rows)


def _corpus_table(path: str | None, device: torch.device) -> CorpusTable | None:
    """The lookup corpus as a table in device memory (`corpus_table`); None where `lookup_corpus` is not set."""
    if path is None:
        return None
    start = time.perf_counter()
    lookup = CorpusLookup(read_answers(Path(path)))
    table = CorpusTable.of(lookup).to(device)
    logger.info("p_eagle: lookup corpus %s: %d answers, %d tokens, a table of %.0f MiB built in %.1f s", path,
                lookup.answers, lookup.tokens, table.nbytes / 2**20, time.perf_counter() - start)
    return table
