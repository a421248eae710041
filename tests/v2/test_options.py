"""p_eagle's options on vLLM 0.34: accepted ones set vLLM up, bad ones are refused with one line naming the field."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm", minversion="0.34", reason="the V2 adapter needs vLLM 0.34 or later")


def _error(make_spec, **fields) -> str:
    from pydantic import ValidationError

    with pytest.raises((ValidationError, ValueError)) as info:
        make_spec(**fields)
    return str(info.value)


def test_defaults_set_up_an_eagle_style_parallel_drafter(make_spec) -> None:
    spec = make_spec()
    assert (spec.method, spec.custom_method) == ("eagle3", "p_eagle")
    assert spec.draft_sample_method == "probabilistic" and spec.rejection_sample_method == "standard"
    sc = spec.speculator_config
    assert type(sc).__name__ == "PEagleSpeculatorConfig" and sc.parallel_drafting and sc.uses_aux_hidden_states
    assert sc.num_lookahead_tokens == 4 and spec.needs_eagle_block_drop()
    assert list(spec.draft_model_config.hf_config.eagle_aux_hidden_state_layer_ids) == [1, 2, 3]


def test_verify_block_selects_vllm_block_verification(make_spec) -> None:
    assert make_spec(speculator_options={"verify": "block"}).rejection_sample_method == "block"
    assert make_spec(speculator_options={"verify": "standard"}).rejection_sample_method == "standard"


def test_k_defaults_to_the_trained_depth(make_spec) -> None:
    assert make_spec(num_speculative_tokens=None).num_speculative_tokens == 8


def test_all_own_options_are_accepted(make_spec) -> None:
    from peagle_vllm.vllm_adapter.v2.config import options_of

    spec = make_spec(speculator_options={"verify": "auto", "adaptive": False, "min_k": 1,
                                         "acceptance_warn_below": 0.5})
    options = options_of(spec)
    assert (options.adaptive, options.min_k, options.acceptance_warn_below) == (False, 1, 0.5)


def test_prompt_lookup_is_accepted_and_keeps_the_token_history_on_the_device(make_spec) -> None:
    from peagle_vllm.vllm_adapter.v2.config import options_of

    spec = make_spec(speculator_options={"prompt_lookup_max": 4, "prompt_lookup_min": 3})
    assert (options_of(spec).prompt_lookup.min_n, options_of(spec).prompt_lookup.max_n) == (3, 4)
    assert spec.speculator_config.prefer_dense_token_history
    assert not make_spec().speculator_config.prefer_dense_token_history  # (the head alone reads no history)


def test_corpus_lookup_is_accepted_and_a_corpus_for_another_vocabulary_refused(make_spec, tmp_path) -> None:
    from peagle_vllm.vllm_adapter.v2.config import options_of

    row = {"prompt_ids": [1, 2], "response_ids": [3, 4]}
    (tmp_path / "answers.jsonl").write_text(json.dumps(row) + "\n")
    spec = make_spec(speculator_options={"lookup_corpus": str(tmp_path)})
    assert options_of(spec).lookup_corpus == str(tmp_path) and options_of(spec).prompt_lookup is None
    assert spec.speculator_config.prefer_dense_token_history
    vocab = spec.target_model_config.get_vocab_size()
    (tmp_path / "more.jsonl").write_text(json.dumps({**row, "response_ids": [3, vocab]}) + "\n")
    message = _error(make_spec, speculator_options={"lookup_corpus": str(tmp_path)})
    assert "speculative_config['speculator_options']['lookup_corpus']: " in message
    assert f"token id {vocab} is outside the target's vocabulary of {vocab}: these answers were written" in message


@pytest.mark.parametrize("fields, names", [
    ({"speculator_options": {"verify": "blok"}}, "speculative_config['speculator_options']['verify']"),
    ({"speculator_options": {"adaptive": "yes"}}, "speculative_config['speculator_options']['adaptive']"),
    ({"speculator_options": {"min_k": 9}}, "speculative_config['speculator_options']['min_k']"),
    ({"speculator_options": {"acceptance_warn_below": 2}},
     "speculative_config['speculator_options']['acceptance_warn_below']"),
    ({"speculator_options": {"verfy": "block"}}, "speculative_config['speculator_options']['verfy']"),
    ({"speculator_options": {"verifier_accept_k": 3, "accept_tolerance": 1.0}},  # lossy: vLLM's sampler verifies
     "speculative_config['speculator_options']['accept_tolerance']"),
    ({"speculator_options": {"lookup_corpus": "."}},  # no answers there
     "speculative_config['speculator_options']['lookup_corpus']"),
    ({"speculator_options": {"prompt_lookup_max": 5, "head_depth": 2}},  # V2 verifies the same K for every request
     "speculative_config['speculator_options']['head_depth']"),
    ({"speculator_options": {"verifier_accept_k": 0}}, "speculative_config['speculator_options']['verifier_accept_k']"),
    ({"parallel_drafting": True}, "speculative_config['parallel_drafting']"),
    ({"rejection_sample_method": "fly"}, "speculative_config['rejection_sample_method']"),
    ({"rejection_sample_method": "block"}, "speculative_config['rejection_sample_method']"),
    ({"enable_adaptive_verification": True}, "speculative_config['enable_adaptive_verification']"),
    ({"num_speculative_tokens": 33}, "speculative_config['num_speculative_tokens']"),
    ({"num_speculative_tokens": 9}, "speculative_config['num_speculative_tokens']"),  # depth head: 8 slots
])
def test_bad_fields_are_refused_naming_the_field(make_spec, fields, names) -> None:
    message = _error(make_spec, **fields)
    assert names in message


def test_missing_or_wrong_head_is_refused(make_spec, models, tmp_path) -> None:
    assert "speculative_config['model'] is missing" in _error(make_spec, model=None)
    assert "speculative_config['model'] is missing" in _error(make_spec, model=None, num_speculative_tokens=None)
    assert "does not exist" in _error(make_spec, model=str(tmp_path / "nope"))
    assert "has no config.json" in _error(make_spec, model=str(tmp_path))


def test_head_for_another_target_is_refused(make_spec, models, tmp_path) -> None:
    from tiny_models import build_random_head, build_tiny_target

    other = build_tiny_target(tmp_path / "other", hidden=32, layers=4, vocab=512)
    head = build_random_head(other, tmp_path / "other_head", k=4)
    assert "target_hidden_size 32 does not match" in _error(make_spec, model=str(head))


def test_vllms_batch_size_schedule_is_accepted(make_spec) -> None:
    spec = make_spec("depth", num_speculative_tokens=8, num_speculative_tokens_per_batch_size=[(1, 4, 8), (5, 64, 2)])
    assert spec.uses_dynamic_speculative_decoding() and spec.num_speculative_tokens == 8


def test_multi_layer_head_is_accepted(make_spec) -> None:
    spec = make_spec("two_layer", num_speculative_tokens=4)
    assert spec.draft_model_config.hf_config.num_hidden_layers == 2 and spec.num_speculative_tokens == 4


@pytest.mark.parametrize("parallel, words", [({"pipeline_parallel_size": 2}, "pipeline parallelism"),
                                             ({"data_parallel_size": 2}, "--data-parallel-size 1")])
def test_pipeline_and_data_parallelism_are_refused(make_spec, parallel, words) -> None:
    from vllm.config import ParallelConfig

    assert words in _error(make_spec, target_parallel_config=ParallelConfig(**parallel))
