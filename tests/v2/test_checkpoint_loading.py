"""Both checkpoint layouts load on vLLM 0.34 (which refuses P-EAGLE checkpoints itself) into the config and into
the vLLM-layer modules, with the same weights as the core's `load_head`."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("vllm", minversion="0.34", reason="the V2 adapter needs vLLM 0.34 or later")


def test_vllm_034_itself_refuses_peagle_checkpoints(models) -> None:
    from transformers import PretrainedConfig
    from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig

    raw, _ = PretrainedConfig.get_config_dict(str(models["depth"]))
    with pytest.raises(ValueError, match="P-EAGLE"):
        SpeculatorsConfig.extract_transformers_pre_trained_config(raw)


@pytest.mark.parametrize("head", ["standard", "depth", "vllm_layout"])
def test_both_layouts_give_the_same_draft_config(make_spec, head) -> None:
    from peagle_vllm.checkpoint import read_head_config
    from peagle_vllm.vllm_adapter.v2.hf_config import ARCHITECTURE, head_of

    spec = make_spec(head)
    draft = spec.draft_model_config
    assert draft.hf_config.architectures == [ARCHITECTURE]
    assert head_of(draft.hf_config) == read_head_config(spec.model)
    assert draft.get_vocab_size() == 512 and draft.get_hidden_size() == 64
    assert draft.hf_config.mask_token_id == head_of(draft.hf_config).mask_token_id is not None


def test_layouts_agree(make_spec) -> None:
    from peagle_vllm.vllm_adapter.v2.hf_config import head_of

    a, b = (head_of(make_spec(h).draft_model_config.hf_config) for h in ("depth", "vllm_layout"))
    assert a == b


@pytest.mark.parametrize("head", ["standard", "depth", "vllm_layout"])
def test_weights_load_into_vllm_modules_as_into_the_core_head(make_spec, build_draft_model, head) -> None:
    from peagle_vllm.checkpoint import load_head

    spec = make_spec(head)
    model = build_draft_model(spec)
    ref = load_head(spec.model)
    layer, ref_layer = model.model.layers[0], ref.layers[0]
    qkv = torch.cat([ref_layer.self_attn.q_proj.weight, ref_layer.self_attn.k_proj.weight,
                     ref_layer.self_attn.v_proj.weight])
    assert torch.equal(layer.self_attn.qkv_proj.weight, qkv)
    assert torch.equal(layer.mlp.gate_up_proj.weight, torch.cat([ref_layer.mlp.gate_proj.weight,
                                                                 ref_layer.mlp.up_proj.weight]))
    assert torch.equal(model.model.fc.weight, ref.fc.weight)
    assert torch.equal(model.lm_head.weight, ref.lm_head.weight)
    assert torch.equal(model.model.embed_tokens.weight, ref.embed_tokens.weight)
    assert torch.equal(model.mask_hidden, ref.mask_hidden)
    assert torch.equal(model.d2t, ref.d2t)
    if ref.cfg.draft_vocab_size < ref.cfg.vocab_size:
        assert torch.equal(model.draft_to_target, ref.draft_to_target())
    else:
        assert model.draft_to_target is None


def test_unexpected_tensor_is_refused(make_spec, build_draft_model) -> None:
    model = build_draft_model(make_spec("standard"))
    with pytest.raises(ValueError, match="unexpected tensor 'extra.weight'"):
        model.load_weights([("extra.weight", torch.zeros(1))])


@pytest.mark.parametrize("head", ["standard", "depth", "vllm_layout"])
def test_every_parameter_counts_as_loaded(make_spec, build_draft_model, head) -> None:
    """vLLM's loader refuses a model whose load_weights leaves a parameter out."""
    from safetensors.torch import load_file

    spec = make_spec(head)
    model = build_draft_model(spec)
    loaded = model.load_weights(load_file(f"{spec.model}/model.safetensors").items())
    assert set(dict(model.named_parameters())) <= loaded and model.has_own_embed_tokens


def test_head_without_embeddings_shares_the_targets(make_spec, build_draft_model, models, tmp_path) -> None:
    from peagle_vllm.checkpoint import load_head, save_head

    out = tmp_path / "shared"
    save_head(load_head(models["standard"]), out, verifier="tiny", dtype=torch.float32, share_embeddings=True)
    model = build_draft_model(make_spec(str(out)))
    assert not model.has_own_embed_tokens  # vLLM's maybe_share_target_embed then gives it the target's
