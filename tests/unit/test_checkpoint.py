"""Checkpoint formats: export -> load round trip, vLLM's EAGLE-3 layout, and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from peagle_vllm.checkpoint import CheckpointError, load_head, read_head_config, read_tensors, save_head, validate_weights
from unit.test_head import make


def test_export_load_round_trip_gives_identical_logits(tmp_path: Path) -> None:
    head = make("depth", k=8, vd=40)
    save_head(head, tmp_path / "h", verifier="t", dtype=torch.float32)
    loaded = load_head(tmp_path / "h")
    ids, aux = torch.randint(0, 100, (2, 4)), torch.randn(2, 4, 96)
    a = head.draft_block(ids[:, -1], aux[:, -1], ids, aux, 8)
    b = loaded.draft_block(ids[:, -1], aux[:, -1], ids, aux, 8)
    assert torch.equal(a, b)
    pos = torch.arange(4).expand(2, -1)
    assert torch.allclose(head(ids, head.combine_hidden_states(aux), pos)[0],
                          loaded(ids, loaded.combine_hidden_states(aux), pos)[0])
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "peagle" and cfg["mask_token_id"] == 7
    assert cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 8


def test_loads_vllm_eagle3_layout(tmp_path: Path) -> None:
    """amazon/*-p-eagle style: LlamaForCausalLMEagle3 config, midlayer.* weights, pard_token."""
    head = make("standard", vd=100)
    tensors = {k.replace("layers.0.", "midlayer."): v for k, v in head.state_dict().items()}
    out = tmp_path / "vllm"
    out.mkdir()
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    c = head.cfg
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": 32, "vocab_size": 100,
        "draft_vocab_size": 100, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "pard_token": 7, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]},
        "num_speculative_tokens": 8}))
    loaded = load_head(out)
    assert loaded.cfg.mask_token_id == 7 and loaded.cfg.aux_layer_ids == c.aux_layer_ids
    assert torch.equal(loaded.fc.weight, head.fc.weight)
    assert torch.equal(loaded.layers[0].self_attn.q_proj.weight, head.layers[0].self_attn.q_proj.weight)


def test_missing_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        read_head_config(tmp_path / "nope")


def _export(tmp_path: Path) -> Path:
    save_head(make(), tmp_path / "h", verifier="t")
    return tmp_path / "h"


def test_checkpoint_without_mask_token_is_refused(tmp_path: Path) -> None:
    path = _export(tmp_path)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["mask_token_id"]
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="no mask token"):
        validate_weights(read_head_config(path), read_tensors(path, ("mask_hidden", "d2t")), str(path))


def test_checkpoint_without_mask_hidden_is_refused(tmp_path: Path) -> None:
    path = _export(tmp_path)
    weights = load_file(str(path / "model.safetensors"))
    del weights["mask_hidden"]
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="mask_hidden"):
        validate_weights(read_head_config(path), read_tensors(path, ("mask_hidden", "d2t")), str(path))


def test_truncated_safetensors_is_refused(tmp_path: Path) -> None:
    path = _export(tmp_path)
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        read_tensors(path, ("mask_hidden",))


def test_d2t_outside_the_target_vocabulary_is_refused(tmp_path: Path) -> None:
    path = _export(tmp_path)
    weights = load_file(str(path / "model.safetensors"))
    weights["d2t"] = weights["d2t"] + 1000
    save_file(weights, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="outside the target vocabulary"):
        validate_weights(read_head_config(path), read_tensors(path, ("mask_hidden", "d2t")), str(path))


def test_a_head_sharing_its_targets_embeddings_is_refused_without_them(tmp_path: Path) -> None:
    """Saved without `embed_tokens`, a head loads only with the target's embeddings given (random ones would draft
    nonsense), and with them drafts as saved."""
    head = make("depth", k=8, vd=40)
    save_head(head, tmp_path / "h", verifier="t", dtype=torch.float32, share_embeddings=True)
    with pytest.raises(CheckpointError, match="target_embeddings"):
        load_head(tmp_path / "h")
    loaded = load_head(tmp_path / "h", target_embeddings=head.embed_tokens.weight.detach())
    ids, aux = torch.randint(0, 100, (2, 4)), torch.randn(2, 4, 96)
    assert torch.equal(head.draft_block(ids[:, -1], aux[:, -1], ids, aux, 8),
                       loaded.draft_block(ids[:, -1], aux[:, -1], ids, aux, 8))


def test_a_calibrated_draft_temperature_is_written_read_back_and_checked(tmp_path: Path) -> None:
    path = _export(tmp_path)
    assert "draft_temperature" not in json.loads((path / "config.json").read_text())  # uncalibrated: 1
    assert read_head_config(path).draft_temperature == 1.0
    head = make()
    head.cfg.draft_temperature = 0.75
    save_head(head, path, verifier="t")
    assert read_head_config(path).draft_temperature == 0.75
    cfg = json.loads((path / "config.json").read_text())
    cfg["draft_temperature"] = -1
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="'draft_temperature' must be a number above 0") as err:
        read_head_config(path)
    assert "\n" not in str(err.value)
