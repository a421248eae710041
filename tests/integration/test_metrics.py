"""peagle: series in LLM.get_metrics(), consistent with vLLM's own spec-decode counters."""

from __future__ import annotations

from peagle_vllm.harness.runs import close_llm, make_llm


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


def _chosen_k(llm) -> dict[str, int]:
    """peagle:chosen_k by its K label."""
    return {m.labels["k"]: m.value for m in llm.get_metrics() if m.name == "peagle:chosen_k"}


def test_peagle_series_agree_with_vllm_counters(demo) -> None:
    """Our series against vLLM's counters, in the second p_eagle engine of the process: like vLLM's
    own, they start afresh with each front end (not summed with the first engine's) and carry its labels."""
    from vllm import SamplingParams

    from peagle_vllm.harness.corpus import held_out_prompts

    spec = {"method": "p_eagle", "model": str(demo["draft"]), "num_speculative_tokens": 8}
    first = make_llm(str(demo["target"]), {**spec, "adaptive": False})
    first.generate(held_out_prompts(2, seed=3), SamplingParams(temperature=0, max_tokens=24), use_tqdm=False)
    assert _totals(first)["peagle:accepted_tokens_per_position"] > 0
    close_llm(first)
    llm = make_llm(str(demo["target"]), spec)
    llm.generate(held_out_prompts(6, seed=2), SamplingParams(temperature=0, max_tokens=64), use_tqdm=False)
    totals, chosen_k = _totals(llm), _chosen_k(llm)
    ours = [m for m in llm.get_metrics() if m.name.startswith("peagle:")]
    close_llm(llm)
    assert totals["vllm:spec_decode_num_drafts"] > 0
    assert totals["peagle:accepted_tokens_per_position"] == totals["vllm:spec_decode_num_accepted_tokens"]
    assert totals["peagle:draft_tokens_per_position"] == totals["vllm:spec_decode_num_draft_tokens"]
    assert totals["peagle:acceptance_length"] > 0  # one observation per engine step with drafts
    assert 0.0 <= totals["peagle:block_acceptance_rate_window"] <= 1.0
    # engine-side figures: a K chosen per request per step (drafts chosen are verified the step after,
    # except a finished request's last ones), one timed draft forward behind every verifying step
    drafts_chosen = sum(int(k) * n for k, n in chosen_k.items())
    assert drafts_chosen >= totals["vllm:spec_decode_num_draft_tokens"] > 0
    assert totals["peagle:chosen_k"] >= totals["vllm:spec_decode_num_drafts"]
    assert totals["peagle:fallback_request_steps"] == chosen_k.get("0", 0)
    assert totals["peagle:draft_forward_seconds"] >= totals["peagle:acceptance_length"]
    assert {(m.labels["model_name"], m.labels["engine"], m.labels["acceptance"]) for m in ours} == {
        (str(demo["target"]), "0", "lossless")}


def test_per_request_spec_decode_metrics_when_asked(demo) -> None:
    """vLLM's per-request option reports p_eagle's drafted and accepted counts in each output."""
    from vllm import SamplingParams

    from peagle_vllm.harness.corpus import held_out_prompts

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
