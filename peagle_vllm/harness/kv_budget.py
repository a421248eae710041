"""KV-cache blocks a speculative method holds: an in-process engine is stepped by hand and its
scheduler's block pool read after every step (peak and mean blocks in use, peak concurrency).

Used by `scripts/kv_budget.py` (ours vs vLLM's built-in parallel drafting, and the concurrency a
fixed KV budget admits) and by the rollback tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from peagle_vllm.harness.runs import close_llm, make_llm, set_cpu_defaults


@dataclass
class KVFigures:
    block_size: int
    total_blocks: int
    peak_blocks: int  # most blocks in use after any step
    mean_blocks: float  # blocks in use, averaged over steps
    peak_running: int  # most requests running at once
    preemptions: int  # times a running request lost its blocks for lack of room
    released_early: int  # blocks p_eagle handed back before their request ended
    end_blocks: int  # blocks still in use when every request has finished
    token_ids: list[list[int]]

    def summary(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "token_ids"}


def _scheduler(llm):
    """The engine core's scheduler (in-process engine: VLLM_ENABLE_V1_MULTIPROCESSING=0)."""
    core = llm.llm_engine.engine_core
    return core.engine_core.scheduler


def measure(llm, prompts: list[str], max_tokens: int) -> KVFigures:
    """Runs all prompts at once (greedy) and samples the block pool after each engine step."""
    from vllm import SamplingParams

    from peagle_vllm.vllm_adapter.v1.scheduler_state import state_of

    engine, scheduler = llm.llm_engine, _scheduler(llm)
    pool = scheduler.kv_cache_manager.block_pool
    total = pool.num_gpu_blocks - 1  # block 0 is vLLM's null block, never handed out
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, params)
    used, peak_running, preemptions, outputs = [], 0, 0, {}
    was_running: set[str] = set()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = list(out.outputs[0].token_ids)
        running = {r.request_id for r in scheduler.running}
        preemptions += len({r.request_id for r in scheduler.waiting} & was_running)
        was_running = running
        peak_running = max(peak_running, len(running))
        used.append(total - pool.get_num_free_blocks())
    state = state_of(scheduler)
    return KVFigures(block_size=scheduler.block_size, total_blocks=total, peak_blocks=max(used),
                     mean_blocks=round(sum(used) / len(used), 1), peak_running=peak_running, preemptions=preemptions,
                     released_early=state.blocks_released if state is not None else 0,
                     end_blocks=total - pool.get_num_free_blocks(),
                     token_ids=[outputs[str(i)] for i in range(len(prompts))])


def run(target: str, speculative_config: dict | None, prompts: list[str], max_tokens: int, block_size: int,
        num_blocks: int | None = None, max_num_seqs: int = 256) -> KVFigures:
    """One engine (no prefix caching: every block counted is the request's own), one measurement."""
    set_cpu_defaults()
    llm = make_llm(target, speculative_config, block_size=block_size, enable_prefix_caching=False,
                   num_gpu_blocks_override=num_blocks, max_num_seqs=max_num_seqs)
    try:
        return measure(llm, prompts, max_tokens)
    finally:
        close_llm(llm)
