"""The p_eagle speculative config: every bad value gets one error naming the field and the fix."""

from __future__ import annotations

import pytest

from peagle_vllm.config import PEagleConfigError, check_head_fits_target, split_p_eagle_config
from peagle_vllm.head import HeadConfig
from peagle_vllm.lookup import PromptLookup

GOOD = {"method": "p_eagle", "model": "/heads/x", "num_speculative_tokens": 8}


def test_valid_config_splits_ours_from_vllms() -> None:
    opts, rest = split_p_eagle_config({**GOOD, "verify": "block", "draft_tensor_parallel_size": 1},
                                      {"model", "num_speculative_tokens", "draft_tensor_parallel_size"})
    assert opts.verify == "block" and opts.num_speculative_tokens == 8
    assert rest == {"model": "/heads/x", "num_speculative_tokens": 8, "draft_tensor_parallel_size": 1}
    assert opts.draft_temperature is None and opts.draft_temperature_for(head(draft_temperature=0.75)) == 0.75
    chosen = split_p_eagle_config({**GOOD, "draft_temperature": 0.6})[0]
    assert chosen.draft_temperature_for(head(draft_temperature=0.75)) == 0.6  # the config's overrides the head's


def test_prompt_lookup_is_off_until_prompt_lookup_max_and_stays_with_p_eagle() -> None:
    assert split_p_eagle_config(GOOD)[0].prompt_lookup is None
    on, rest = split_p_eagle_config({**GOOD, "prompt_lookup_max": 5}, {"model", "num_speculative_tokens"})
    assert on.prompt_lookup == PromptLookup(2, 5) and "prompt_lookup_max" not in rest  # vLLM never sees it
    assert split_p_eagle_config({**GOOD, "prompt_lookup_max": 1})[0].prompt_lookup == PromptLookup(1, 1)
    assert split_p_eagle_config({**GOOD, "prompt_lookup_max": 4, "prompt_lookup_min": 3})[0].prompt_lookup == \
        PromptLookup(3, 4)


def test_corpus_lookup_is_off_until_lookup_corpus(tmp_path) -> None:
    assert not split_p_eagle_config(GOOD)[0].looks_up
    on, rest = split_p_eagle_config({**GOOD, "lookup_corpus": str(tmp_path)}, {"model", "num_speculative_tokens"})
    assert on.looks_up and on.lookup_corpus == str(tmp_path) and on.prompt_lookup is None
    assert "lookup_corpus" not in rest


def test_head_depth_is_all_of_k_until_set_beside_a_lookup() -> None:
    assert split_p_eagle_config({**GOOD, "prompt_lookup_max": 5})[0].head_depth is None
    on, rest = split_p_eagle_config({**GOOD, "prompt_lookup_max": 5, "head_depth": 2},
                                    {"model", "num_speculative_tokens"})
    assert on.head_depth == 2 and "head_depth" not in rest
    assert split_p_eagle_config({**GOOD, "prompt_lookup_max": 5, "head_depth": 8})[0].head_depth == 8


@pytest.mark.parametrize("change,field", [
    ({"model": None}, "model"),
    ({"num_speculative_tokens": 0}, "num_speculative_tokens"),
    ({"num_speculative_tokens": 33}, "num_speculative_tokens"),
    ({"num_speculative_tokens": "8"}, "num_speculative_tokens"),
    ({"num_speculative_tokens": True}, "num_speculative_tokens"),
    ({"model": 5}, "model"),
    ({"verify": "greedyish"}, "verify"),
    ({"parallel_drafting": True}, "parallel_drafting"),
    ({"rejection_sample_method": "standard"}, "rejection_sample_method"),
    ({"num_speculative_tokenz": 4}, "num_speculative_tokenz"),
    ({"prompt_lookup_max": 0}, "prompt_lookup_max"),
    ({"prompt_lookup_max": "5"}, "prompt_lookup_max"),
    ({"prompt_lookup_min": 2}, "prompt_lookup_min"),
    ({"prompt_lookup_max": 2, "prompt_lookup_min": 3}, "prompt_lookup_min"),
    ({"lookup_corpus": "/no/such/answers"}, "lookup_corpus"),
    ({"lookup_corpus": 5}, "lookup_corpus"),
    ({"prompt_lookup_max": 5, "head_depth": 0}, "head_depth"),
    ({"prompt_lookup_max": 5, "head_depth": 9}, "head_depth"),  # past num_speculative_tokens
    ({"prompt_lookup_max": 5, "head_depth": "2"}, "head_depth"),
    ({"head_depth": 2}, "head_depth"),  # no lookup drafts past it
    ({"suffix_decoding_max_tree_depth": 8}, "suffix_decoding_max_tree_depth"),
    ({"adaptive": "yes"}, "adaptive"),
    ({"min_k": 9}, "min_k"),
    ({"min_k": -1}, "min_k"),
    ({"acceptance_warn_below": 1.5}, "acceptance_warn_below"),
    ({"head_matmul_dtype": "bfloat16"}, "head_matmul_dtype"),
    ({"draft_temperature": 0}, "draft_temperature"),
    ({"draft_temperature": "0.7"}, "draft_temperature"),
    ({"draft_temperature": float("nan")}, "draft_temperature"),
])
def test_bad_values_name_the_field(change: dict, field: str) -> None:
    cfg = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    with pytest.raises(PEagleConfigError) as err:
        split_p_eagle_config(cfg, {"model", "num_speculative_tokens"})
    message = str(err.value)
    assert f"speculative_config['{field}']" in message and "\n" not in message


def head(**kw) -> HeadConfig:
    base = dict(hidden_size=256, vocab_size=4096, draft_vocab_size=2048, intermediate_size=1024,
                num_attention_heads=4, num_key_value_heads=4, aux_layer_ids=[1, 2, 3], mask_token_id=1,
                variant="depth", trained_depth=16)
    return HeadConfig(**{**base, **kw})


@pytest.mark.parametrize("cfg,k,match", [
    (head(hidden_size=128), 8, "hidden size"),
    (head(vocab_size=5000), 8, "vocabulary"),
    (head(aux_layer_ids=[1, 2, 9]), 8, "eagle_aux_hidden_state_layer_ids"),
    (head(aux_layer_ids=[1, 1, 2]), 8, "eagle_aux_hidden_state_layer_ids"),
    (head(variant="eagle3"), 8, "sequential EAGLE-3"),
    (head(), 17, "at most 16"),
])
def test_head_that_does_not_fit_the_target_is_refused(cfg: HeadConfig, k: int, match: str) -> None:
    with pytest.raises(PEagleConfigError, match=match):
        check_head_fits_target(cfg, "/heads/x", target_hidden_size=256, target_vocab_size=4096, target_num_layers=4, k=k)


def test_standard_head_may_draft_past_its_trained_depth() -> None:
    check_head_fits_target(head(variant="standard", trained_depth=8), "/h", 256, 4096, 4, k=32)
