"""Where a draft head is found (local directory or a Hugging Face id) and the head's positions following the
target's length."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from peagle_vllm.config import PEagleConfigError, PEagleOptions
from peagle_vllm.head import HeadConfig
from peagle_vllm.vllm_adapter.model_path import resolve_draft_path
from peagle_vllm.vllm_adapter.v1.carriers import PEagleMark
from peagle_vllm.vllm_adapter.v1.config_hook import with_target_positions


def test_a_local_directory_is_taken_as_is_and_an_unreachable_hub_id_is_one_line(tmp_path: Path, monkeypatch) -> None:
    head = tmp_path / "org" / "head"
    head.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_draft_path("org/head") == str(head)  # a local path wins over a hub id of the same shape
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(PEagleConfigError, match=r"speculative_config\['model'\] 'someone/absent-head' is neither a "
                                                r"local directory nor .*huggingface-cli download someone/absent-head"):
        resolve_draft_path("someone/absent-head")
    assert resolve_draft_path("no-such-dir") == str(tmp_path / "no-such-dir")  # not an id: left to the reader's error


def test_the_heads_positions_reach_the_targets_length_and_never_shrink() -> None:
    head = HeadConfig(hidden_size=64, vocab_size=512, draft_vocab_size=512, intermediate_size=128,
                      num_attention_heads=2, num_key_value_heads=2, aux_layer_ids=[1, 2, 3], mask_token_id=1,
                      max_position_embeddings=2048)
    mark = PEagleMark(PEagleOptions(model="m", num_speculative_tokens=8), head)
    assert with_target_positions(mark, 8192).head.max_position_embeddings == 8192
    assert with_target_positions(mark, 1024) is mark
    assert dataclasses.replace(with_target_positions(mark, 8192).head, max_position_embeddings=2048) == head
