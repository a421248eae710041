"""p_eagle inside a real vLLM engine on the CPU backend (offline LLM API)."""

from __future__ import annotations

import pytest

from peagle_vllm.harness.corpus import held_out_prompts
from peagle_vllm.harness.runs import close_llm, generate, make_llm, spec_figures


def p_eagle(model, k: int = 8, **extra) -> dict:
    return {"method": "p_eagle", "model": str(model), "num_speculative_tokens": k, **extra}


def test_greedy_identical_to_no_speculation_on_demo_models(demo) -> None:
    """16 held-out prompts of mixed lengths, batched, 128 new tokens each: token-for-token equal (fixed K,
    so that every step speculates: adaptive depth may rightly fall back at this load on this CPU)."""
    prompts = held_out_prompts(16, min_chars=40, max_chars=900)
    assert len({len(p) for p in prompts}) > 8
    base = generate(str(demo["target"]), None, prompts, 128)
    ours = generate(str(demo["target"]), p_eagle(demo["draft"], 8, adaptive=False), prompts, 128)
    assert ours.token_ids == base.token_ids
    assert all(len(t) == 128 or t for t in ours.token_ids)
    print(f"demo K=8 acceptance length {ours.spec.acceptance_length:.2f}")
    assert ours.spec.acceptance_length > 1.5


def test_greedy_identical_at_k32_with_draft_vocabulary_map(tiny) -> None:
    prompts = [f"def f{i}(x):\n" + "    return x" * (i % 4) for i in range(12)]
    base = generate(str(tiny["target"]), None, prompts, 96)
    ours = generate(str(tiny["target"]), p_eagle(tiny["depth"], 32, adaptive=False), prompts, 96)
    assert ours.token_ids == base.token_ids
    assert ours.spec.draft_tokens == 32 * ours.spec.drafts


def _counts(worker) -> tuple[int, int]:
    drafter = worker.model_runner.drafter
    return drafter.num_proposals, drafter.model.num_forwards


def test_all_k_drafts_come_from_one_head_forward_per_step(tiny) -> None:
    from vllm import SamplingParams

    llm = make_llm(str(tiny["target"]), p_eagle(tiny["head"], 8, adaptive=False))
    (p0, f0), = llm.collective_rpc(_counts)
    before = spec_figures(llm)
    llm.generate(["def f3(x):\n"], SamplingParams(temperature=0, max_tokens=40, ignore_eos=True), use_tqdm=False)
    (p1, f1), = llm.collective_rpc(_counts)
    spec = spec_figures(llm).minus(before)
    assert p1 - p0 >= 10, "the proposer did not run each step"
    assert f1 - f0 == p1 - p0, "more than one head forward per step"
    close_llm(llm)
    assert spec.draft_tokens == 8 * spec.drafts  # K drafts per proposal, from that one forward


def test_plain_decoding_and_other_methods_unchanged_by_plugin(tiny) -> None:
    """vLLM's built-in parallel drafting still runs (with its own sampler) next to the plugin."""
    prompts = ["def f1(x):\n", "x = 3\n"]
    base = generate(str(tiny["target"]), None, prompts, 48)
    builtin = generate(str(tiny["target"]), {"method": "eagle3", "parallel_drafting": True, "model": str(tiny["head"]),
                                             "num_speculative_tokens": 4}, prompts, 48)
    assert builtin.token_ids == base.token_ids and builtin.spec.drafts > 0
