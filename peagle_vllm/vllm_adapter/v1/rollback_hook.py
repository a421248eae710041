"""KV-cache rollback in vLLM (the policy is `peagle_vllm.rollback`).

vLLM already moves a request's `num_computed_tokens` back by its rejected drafts, so their slots
are overwritten before they are read. What this module adds:

- Scheduler (engine core): each request reserves draft-head lookahead for its own K
  (`KVCacheManager.allocate_slots` is wrapped on the scheduler's instance), and after each step a
  request's tail blocks that its next step will not touch go back to the pool at once
  (`release_surplus`); the new block counts ride to the worker on the next `SchedulerOutput`
  (`carriers.block_counts`).
- Worker: `apply_block_counts` truncates the runner's copy of those block lists before the step's
  new blocks are appended, and `poison_stale_kv` (only with PEAGLE_VLLM_POISON_STALE_KV set, a
  verification aid used by the tests) writes a huge value into every stale slot before each step,
  so that any read of a rejected token's KV would change the output (not NaN: the CPU kernel
  multiplies a whole block, masked positions included, by their zero weights, and 0 * NaN = NaN).
  Set to "1" it poisons exactly the stale slots; set to "control" it also poisons each request's
  last committed token, which attention does read: the test's proof that the poison reaches what a
  step reads.
"""

from __future__ import annotations

import os

import torch

from peagle_vllm.rollback import blocks_for, next_step_tokens, stale_slots
from peagle_vllm.vllm_adapter.v1 import carriers

POISON_ENV = "PEAGLE_VLLM_POISON_STALE_KV"
POISON_VALUE = 1e4


def reserve_own_lookahead(scheduler, lookahead_for) -> None:
    """Wraps the scheduler's allocate_slots so that the draft-head lookahead it reserves for a
    request is `lookahead_for(request)` instead of K_max for everyone."""
    manager = scheduler.kv_cache_manager
    original = manager.allocate_slots
    full = scheduler.num_lookahead_tokens

    def allocate_slots(request, num_new_tokens, *args, num_lookahead_tokens: int = 0, **kwargs):
        if num_lookahead_tokens == full and full > 0:
            num_lookahead_tokens = min(full, lookahead_for(request))
        return original(request, num_new_tokens, *args, num_lookahead_tokens=num_lookahead_tokens, **kwargs)

    manager.allocate_slots = allocate_slots


def schedule_without_lookahead(scheduler, schedule, args: tuple, kwargs: dict):
    """`schedule(scheduler, *args, **kwargs)` with vLLM's own allocate_slots and no draft lookahead, for a step
    where no request may draft and none can join (a batch in fallback; a full batch admits none): the wrapper
    above would reserve nothing for any of them, at a Python call per request per step (0.5% of a plain step at
    concurrency 64)."""
    manager = scheduler.kv_cache_manager
    own, full = manager.__dict__.pop("allocate_slots"), scheduler.num_lookahead_tokens
    scheduler.num_lookahead_tokens = 0
    try:
        return schedule(scheduler, *args, **kwargs)
    finally:
        manager.allocate_slots, scheduler.num_lookahead_tokens = own, full


def trimmable_managers(scheduler) -> list:
    """Full-attention group managers (tail blocks of those hold no state beyond the tokens);
    empty when any group is of another kind (sliding window, Mamba...): then nothing is trimmed."""
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    managers = list(scheduler.kv_cache_manager.coordinator.single_type_managers)
    return managers if all(type(m) is FullAttentionManager for m in managers) else []


def release_surplus(managers: list, request, lookahead: int) -> tuple[tuple[int, ...], int] | None:
    """Frees the request's tail blocks beyond its next step's needs (committed tokens + bonus +
    its drafts + `lookahead`) in `managers` (from trimmable_managers); returns (blocks kept per KV
    group, blocks freed) when any were."""
    needed = next_step_tokens(request.num_computed_tokens, len(request.spec_token_ids), lookahead)
    kept, freed = [], 0
    for manager in managers:
        blocks = manager.req_to_blocks.get(request.request_id)
        keep = blocks_for(needed, manager.block_size)
        if blocks is None or len(blocks) <= keep or keep < manager.num_cached_block.get(request.request_id, 0):
            kept.append(len(blocks or ()))
            continue
        tail = blocks[keep:]
        del blocks[keep:]
        manager.block_pool.free_blocks(reversed(tail))
        kept.append(keep)
        freed += len(tail)
    return (tuple(kept), freed) if freed else None


def apply_block_counts(runner, scheduler_output) -> None:
    """Worker side of release_surplus: cut the runner's block lists (and persistent block-table
    rows) to what the scheduler kept, before this step appends its new blocks."""
    for req_id, kept in carriers.block_counts(scheduler_output).items():
        state = runner.requests.get(req_id)
        if state is None:
            continue
        row = runner.input_batch.req_id_to_index.get(req_id)
        for group, n in enumerate(kept):
            ids = state.block_ids[group]
            if row is not None and ids:
                table = runner.input_batch.block_table.block_tables[group]
                per_block = int(table.num_blocks_per_row[row]) // len(ids)  # kernel blocks per KV block
                table.block_table.np[row, n * per_block: table.num_blocks_per_row[row]] = 0
                table.num_blocks_per_row[row] = n * per_block
            del ids[n:]


def poison_mode() -> str | None:
    """None (off), "1" (stale slots only) or "control" (also the last committed token)."""
    mode = os.environ.get(POISON_ENV) or None
    if mode not in (None, "1", "control"):
        raise ValueError(f"{POISON_ENV} must be 1 or control, got {mode!r}")
    return mode


def poison_stale_kv(runner, mode: str) -> None:
    """POISON_VALUE into every slot at or past each scheduled request's committed length, in every layer
    (target and draft). The step writes its own tokens' KV before reading it, so only a read of
    stale KV (a rejected draft, a mask slot) can see the poison."""
    context = runner.compilation_config.static_forward_context
    back = 1 if mode == "control" else 0
    for group_id, group in enumerate(runner.kv_cache_config.kv_cache_groups):
        block_size = group.kv_cache_spec.block_size
        states = [runner.requests[r] for r in runner.input_batch.req_ids if r in runner.requests]
        slots = [stale_slots(s.block_ids[group_id], s.num_computed_tokens - back, block_size) for s in states
                 if s.num_computed_tokens > 0]
        if not slots:
            continue
        slot_mapping = torch.cat(slots).to(runner.device)
        for name in group.layer_names:
            layer = context[name]
            shape = (slot_mapping.numel(), layer.num_kv_heads, layer.head_size)
            poison = torch.full(shape, POISON_VALUE, dtype=layer.kv_cache.dtype, device=runner.device)
            layer.impl.do_kv_cache_update(layer, poison, poison, layer.kv_cache, slot_mapping)
