"""Lossy tolerance acceptance through vLLM: the speculative config's keys reach the sampler, and the peagle:
series say the engine is lossy."""

from __future__ import annotations

from peagle_vllm.harness.runs import close_llm, make_llm, spec_figures


def test_a_tolerance_that_admits_every_token_accepts_every_greedy_draft(demo) -> None:
    """accept_k = the whole vocabulary and a huge tolerance: every verified draft of a greedy request is accepted
    (the demo head's drafts are not all the target's argmax, so the lossless rule would reject some)."""
    from vllm import SamplingParams

    from peagle_vllm.harness.corpus import held_out_prompts

    spec = {"method": "p_eagle", "model": str(demo["draft"]), "num_speculative_tokens": 8, "adaptive": False,
            "verifier_accept_k": 4096, "accept_tolerance": 1e9}
    llm = make_llm(str(demo["target"]), spec)
    llm.generate(held_out_prompts(3, seed=2), SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)
    figures = spec_figures(llm)
    labels = {m.labels.get("acceptance") for m in llm.get_metrics() if m.name.startswith("peagle:")}
    close_llm(llm)
    assert figures.draft_tokens > 0 and figures.accepted == figures.draft_tokens
    assert labels == {"lossy"}
