"""peagle: series in LLM.get_metrics(), consistent with vLLM's own spec-decode counters."""

from __future__ import annotations

from peagle_vllm.runs import close_llm, make_llm


def _totals(llm) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        if m.name.startswith("peagle:") or m.name.startswith("vllm:spec_decode_num"):
            value = getattr(m, "value", None)
            if value is None:
                value = getattr(m, "count", None)
            if value is None:
                value = sum(getattr(m, "values", []))
            out[m.name] = out.get(m.name, 0) + value
    return out


def test_peagle_series_agree_with_vllm_counters(demo) -> None:
    from vllm import SamplingParams

    from peagle_vllm.corpus import held_out_prompts

    llm = make_llm(str(demo["target"]), {"method": "p_eagle", "model": str(demo["draft"]), "num_speculative_tokens": 8})
    before = _totals(llm)
    llm.generate(held_out_prompts(6, seed=2), SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    after = _totals(llm)
    close_llm(llm)
    delta = {k: after[k] - before.get(k, 0) for k in after}
    assert delta["vllm:spec_decode_num_drafts"] > 0
    assert delta["peagle:accepted_tokens_per_position"] == delta["vllm:spec_decode_num_accepted_tokens"]
    assert delta["peagle:draft_tokens_per_position"] == delta["vllm:spec_decode_num_draft_tokens"]
    assert delta["peagle:acceptance_length"] > 0  # one observation per engine step with drafts
    assert 0.0 <= after["peagle:block_acceptance_rate_window"] <= 1.0


def test_per_request_spec_decode_metrics_when_asked(demo) -> None:
    """vLLM's per-request option reports p_eagle's drafted and accepted counts in each output."""
    from vllm import SamplingParams

    from peagle_vllm.corpus import held_out_prompts

    llm = make_llm(str(demo["target"]), {"method": "p_eagle", "model": str(demo["draft"]), "num_speculative_tokens": 8,
                                         "adaptive": False}, per_request_spec_decode_metrics="summary")
    outs = llm.generate(held_out_prompts(3, seed=2), SamplingParams(temperature=0, max_tokens=48), use_tqdm=False)
    close_llm(llm)
    for out in outs:
        m = out.outputs[0].spec_decode_metrics
        assert m is not None and m.num_draft_tokens > 0
        accepted = sum(j * n for j, n in enumerate(m.histogram))
        steps = sum(m.histogram)
        assert steps > 0 and accepted <= m.num_draft_tokens
        # every token after the prefill's came from a verify step (accepted drafts + one); max_tokens may cut the last
        emitted = len(out.outputs[0].token_ids) - 1
        assert emitted <= accepted + steps < emitted + 9
