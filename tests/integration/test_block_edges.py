"""Ends of requests that fall inside an accepted block: max_tokens, stop strings, EOS, max_model_len;
logprobs of accepted tokens are the target's; requests joining and leaving between steps."""

from __future__ import annotations

import pytest

from peagle_vllm.harness.corpus import held_out_prompts
from peagle_vllm.harness.runs import close_llm, make_llm, spec_figures


@pytest.fixture(scope="module")
def pair(demo):
    plain = make_llm(str(demo["target"]), None, max_model_len=320)
    ours = make_llm(str(demo["target"]), {"method": "p_eagle", "model": str(demo["draft"]), "num_speculative_tokens": 8},
                    max_model_len=320)
    yield plain, ours
    close_llm(plain)
    close_llm(ours)


def _run(llm, prompts, **params):
    from vllm import SamplingParams

    sps = [SamplingParams(temperature=0, **p) for p in params["each"]] if "each" in params else \
        SamplingParams(temperature=0, **params)
    return llm.generate(prompts, sps, use_tqdm=False)


def test_max_tokens_and_join_leave_inside_blocks(pair) -> None:
    plain, ours = pair
    prompts = held_out_prompts(12, seed=3)
    each = [{"max_tokens": m} for m in (1, 2, 3, 5, 7, 9, 11, 13, 17, 25, 40, 64)]
    before = spec_figures(ours)
    a, b = _run(plain, prompts, each=each), _run(ours, prompts, each=each)
    assert spec_figures(ours).minus(before).accepted > 0
    for x, y, p in zip(a, b, each):
        assert y.outputs[0].token_ids == x.outputs[0].token_ids
        assert len(y.outputs[0].token_ids) <= p["max_tokens"]
        assert y.outputs[0].finish_reason == x.outputs[0].finish_reason


def test_stop_strings_inside_blocks(pair) -> None:
    plain, ours = pair
    prompts = held_out_prompts(6, seed=4)
    free = _run(plain, prompts, max_tokens=48)
    stops = [o.outputs[0].text[10:14] or "\n" for o in free]
    for prompt, stop in zip(prompts, stops):
        a, b = _run(plain, [prompt], max_tokens=48, stop=[stop]), _run(ours, [prompt], max_tokens=48, stop=[stop])
        assert b[0].outputs[0].text == a[0].outputs[0].text
        assert b[0].outputs[0].finish_reason == a[0].outputs[0].finish_reason


def test_eos_inside_a_block_ends_where_plain_decoding_does(pair) -> None:
    plain, ours = pair
    prompts = held_out_prompts(16, seed=5)
    a, b = _run(plain, prompts, max_tokens=200), _run(ours, prompts, max_tokens=200)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]
    assert [o.outputs[0].finish_reason for o in a] == [o.outputs[0].finish_reason for o in b]


def test_max_model_len_inside_a_block(pair) -> None:
    plain, ours = pair
    from transformers import AutoTokenizer

    prompt = held_out_prompts(1, min_chars=2000, max_chars=4000, seed=6)[0]
    tok = AutoTokenizer.from_pretrained(plain.llm_engine.model_config.model)
    ids = tok(prompt).input_ids[:300]  # 20 tokens below max_model_len=320
    from vllm import TokensPrompt

    a = _run(plain, [TokensPrompt(prompt_token_ids=ids)], max_tokens=20)
    b = _run(ours, [TokensPrompt(prompt_token_ids=ids)], max_tokens=20)
    assert b[0].outputs[0].token_ids == a[0].outputs[0].token_ids
    assert len(b[0].outputs[0].token_ids) == 20


def test_logprobs_of_accepted_tokens_are_the_targets(pair) -> None:
    plain, ours = pair
    prompts = held_out_prompts(4, seed=7)
    a, b = _run(plain, prompts, max_tokens=24, logprobs=3), _run(ours, prompts, max_tokens=24, logprobs=3)
    for x, y in zip(a, b):
        assert y.outputs[0].token_ids == x.outputs[0].token_ids
        for lx, ly, tok in zip(x.outputs[0].logprobs, y.outputs[0].logprobs, x.outputs[0].token_ids):
            assert abs(lx[tok].logprob - ly[tok].logprob) < 1e-3
            assert set(lx) == set(ly)
