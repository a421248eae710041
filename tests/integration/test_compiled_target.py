"""p_eagle with the target compiled (torch.compile), as vLLM runs a model unless told `enforce_eager`: the
auxiliary hidden states come from the compiled forward's outputs, and greedy output stays the plain engine's."""

from __future__ import annotations

from peagle_vllm.harness.runs import close_llm, make_llm, spec_figures


def test_greedy_output_with_a_compiled_target_is_plain_decodings(demo) -> None:
    from vllm import SamplingParams

    from peagle_vllm.harness.corpus import held_out_prompts

    prompts, params = held_out_prompts(4, seed=3), SamplingParams(temperature=0, max_tokens=48)
    spec = {"method": "p_eagle", "model": str(demo["draft"]), "num_speculative_tokens": 4, "adaptive": False,
            "prompt_lookup_max": 5}
    outputs, figures = [], None
    for config in (None, spec):
        llm = make_llm(str(demo["target"]), config, enforce_eager=False)
        assert not llm.llm_engine.vllm_config.model_config.enforce_eager
        outputs.append([o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)])
        figures = spec_figures(llm)
        close_llm(llm)
    assert outputs[1] == outputs[0]
    assert figures.draft_tokens > 0 and 0 < figures.accepted < figures.draft_tokens
