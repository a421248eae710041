"""A seeded sampled request whose prompt is prefilled in chunks: vLLM's CPU engine rewinds its
generator with an offset CPU generators lack and dies (every request with it); with the plugin's
guard (`vllm_adapter/generator_hook.py`) it is served, and its seed fixes its tokens however the
prompt was chunked."""

from __future__ import annotations

from peagle_vllm.harness.corpus import held_out_prompts
from peagle_vllm.harness.runs import close_llm, make_llm

CHUNK = 64  # max_num_batched_tokens: the prompt below takes several steps to prefill


def _seeded_runs(target: str, draft: str, prompt: str, **engine_kwargs) -> list[list[int]]:
    """Tokens of: seed 7 (next to a greedy request), seed 7 again, seed 8, in one engine."""
    from vllm import SamplingParams

    def seeded(seed: int) -> SamplingParams:
        return SamplingParams(temperature=1.0, seed=seed, max_tokens=24, ignore_eos=True)

    llm = make_llm(target, {"method": "p_eagle", "model": draft, "num_speculative_tokens": 4}, max_model_len=512,
                   max_num_seqs=4, **engine_kwargs)
    try:
        assert len(llm.get_tokenizer()(prompt).input_ids) > 3 * CHUNK
        greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
        first = llm.generate([prompt, prompt], [seeded(7), greedy], use_tqdm=False)
        assert len(first[1].outputs[0].token_ids) == 24
        later = llm.generate([prompt, prompt], [seeded(7), seeded(8)], use_tqdm=False)
    finally:
        close_llm(llm)
    return [list(o.outputs[0].token_ids) for o in (first[0], *later)]


def test_seeded_sampled_request_with_a_chunked_prompt_is_served_and_repeatable(demo) -> None:
    prompt = held_out_prompts(1, min_chars=900, max_chars=1200, seed=8)[0]
    chunked = _seeded_runs(str(demo["target"]), str(demo["draft"]), prompt, max_num_batched_tokens=CHUNK)
    assert len(chunked[0]) == 24
    assert chunked[1] == chunked[0], "the same seed gives the same tokens"
    assert chunked[2] != chunked[0]
    whole = _seeded_runs(str(demo["target"]), str(demo["draft"]), prompt)
    assert whole[0] == chunked[0], "the chunks' discarded samples leave no trace in the seeded stream"
