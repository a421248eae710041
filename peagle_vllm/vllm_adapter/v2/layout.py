"""Where each row of P-EAGLE's one draft forward comes from, on vLLM 0.34's V2 runner (plain torch, no host
sync, so it runs as-is on CPU in tests and on GPU).

After the target verified a step, request r holds rows [start_r, end_r) of the target batch, of which the last
`num_rejected[r]` were rejected. EAGLE's convention (as vLLM's own EAGLE drafter): the draft row at position p
reads (token x_{p+1}, target hidden h_p). So:

- context rows: the request's valid target rows with their input ids shifted by one; the last valid row,
  at position P_r, gets the bonus token (the last sampled token; the next prompt token while prefill chunks
  remain). The draft K/V of context rows before P_r are stored without attention; rejected rows store nothing.
- query rows, K per request (the ONE forward): depth 0 = (bonus token, fc(h_{P_r})) at P_r, depth d in 1..K-1 =
  (mask token id, the learned mask state of depth d) at P_r + d. Depth d's output drafts the token at
  position P_r + d + 2, i.e. draft d + 1 of the block.

Shapes: B requests, N target rows, K drafts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PAD_SLOT_ID = -1


@dataclass
class ContextRows:
    input_ids: torch.Tensor  # [N] shifted ids (bonus token at each request's last valid row)
    store: torch.Tensor  # [N] bool: valid rows before the last one (their draft K/V are stored)
    last: torch.Tensor  # [B] index of each request's last valid row (depth 0)
    bonus: torch.Tensor  # [B] the bonus token of each request


@dataclass
class QueryRows:
    input_ids: torch.Tensor  # [B*K]
    positions: torch.Tensor  # [B*K] P_r + d, clamped below max_model_len (for rotary)
    raw_positions: torch.Tensor  # [B*K] P_r + d (for the slot mapping: rows past max_model_len store nothing)
    depth: torch.Tensor  # [B*K] 0..K-1
    seq_lens: torch.Tensor  # [B] P_r + K, capped at max_model_len: what the query pass attends to


def bonus_tokens(num_sampled: torch.Tensor, idx_mapping: torch.Tensor, last_sampled: torch.Tensor,
                 next_prefill_tokens: torch.Tensor) -> torch.Tensor:
    """num_sampled/idx_mapping [B], last_sampled [max_reqs], next_prefill_tokens [max_reqs] or
    [lookahead, max_reqs] -> [B]: the last sampled token, or the next prompt token while prefilling."""
    if next_prefill_tokens.dim() == 2:
        next_prefill_tokens = next_prefill_tokens[0]
    return torch.where(num_sampled > 0, last_sampled[idx_mapping].long(), next_prefill_tokens[idx_mapping].long())


def context_rows(target_input_ids: torch.Tensor, query_start_loc: torch.Tensor, num_rejected: torch.Tensor,
                 bonus: torch.Tensor) -> ContextRows:
    """target_input_ids [N] (rows past query_start_loc[-1] are padding), query_start_loc [B+1], num_rejected [B],
    bonus [B] -> ContextRows."""
    n = target_input_ids.shape[0]
    b = num_rejected.shape[0]
    dev = target_input_ids.device
    rows = torch.arange(n, device=dev)
    starts, ends = query_start_loc[:b].long(), query_start_loc[1: b + 1].long()
    valid_end = ends - num_rejected.long()
    last = valid_end - 1
    # request of each row (padding rows past the batch map to the last request and are never stored)
    req = (torch.bucketize(rows, ends, right=True)).clamp(max=b - 1)
    ids = torch.cat([target_input_ids[1:], target_input_ids[-1:]]).long()
    ids = ids.scatter(0, last, bonus.long())
    store = (rows >= starts[req]) & (rows < last[req])
    return ContextRows(ids, store, last, bonus.long())


def query_rows(target_positions: torch.Tensor, last: torch.Tensor, bonus: torch.Tensor, k: int, mask_token_id: int,
               max_model_len: int) -> QueryRows:
    """target_positions [N], last/bonus [B] -> QueryRows for K rows per request."""
    b = last.shape[0]
    dev = last.device
    depth = torch.arange(k, device=dev).repeat(b)  # [B*K]
    p = target_positions[last].long()  # [B] position of each request's depth-0 row
    raw = p.repeat_interleave(k, output_size=b * k) + depth
    ids = torch.where(depth == 0, bonus.long().repeat_interleave(k, output_size=b * k), mask_token_id)
    return QueryRows(ids, raw.clamp(max=max_model_len - 1), raw, depth, (p + k).clamp(max=max_model_len))


def query_hidden(context_hidden: torch.Tensor, last: torch.Tensor, mask_states: torch.Tensor, k: int) -> torch.Tensor:
    """context_hidden [N, H] (fc-combined target states), last [B], mask_states [K-1, H] -> [B*K, H]:
    depth 0 reads its row's fc(h_P), depth d the mask state of depth d."""
    b, h = last.shape[0], context_hidden.shape[-1]
    out = torch.empty(b, k, h, dtype=context_hidden.dtype, device=context_hidden.device)
    out[:, 0] = context_hidden[last]
    if k > 1:
        out[:, 1:] = mask_states[: k - 1].to(out.dtype).unsqueeze(0)
    return out.view(b * k, h)


def query_slots(raw_positions: torch.Tensor, block_table: torch.Tensor, block_size: int, k: int,
                max_model_len: int) -> torch.Tensor:
    """raw_positions [B*K], block_table [>=B, max_blocks] (rows by batch position) -> slot of each query row
    [B*K]; PAD_SLOT_ID where the row has no block (the null block 0, past the table) or lies past max_model_len."""
    b = raw_positions.shape[0] // k
    pos = raw_positions.long()
    blocks_per_row = block_table.shape[1]
    index = (pos // block_size).view(b, k)
    block = block_table[:b].long().gather(1, index.clamp(max=blocks_per_row - 1)).view(-1)
    ok = (block != 0) & (pos < max_model_len) & (index.view(-1) < blocks_per_row)
    return torch.where(ok, block * block_size + pos % block_size, PAD_SLOT_ID)

