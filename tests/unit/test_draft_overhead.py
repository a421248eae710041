"""The V1 draft path's per-step shortcuts give what the plain forms give: fc_norm over all auxiliary chunks at
once (the serving head's combine) and the one-reduction NaN/Inf check (the sampled-rows-only layer tail is held by
the head-parity and greedy-identity engine tests)."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from peagle_vllm.head import HeadConfig


def _cfg(**kw) -> HeadConfig:
    base = dict(hidden_size=32, vocab_size=50, draft_vocab_size=20, intermediate_size=48, num_attention_heads=4,
                num_key_value_heads=2, aux_layer_ids=[1, 2, 3], mask_token_id=0, fc_norm=True, rms_norm_eps=1e-5)
    base.update(kw)
    return HeadConfig(**base)


@pytest.fixture(scope="module")
def vllm_ctx():
    from vllm.config import VllmConfig, set_current_vllm_config
    with set_current_vllm_config(VllmConfig()):
        yield


def _bare_model(cfg: HeadConfig):
    from vllm.model_executor.layers.layernorm import RMSNorm

    from peagle_vllm.vllm_adapter.v1.draft_model import PEagleDraftModel
    model = PEagleDraftModel.__new__(PEagleDraftModel)
    nn.Module.__init__(model)
    model.cfg, model.matmul_dtype = cfg, torch.float32
    model.model = nn.Module()
    model.model.fc_norm = nn.ModuleList(RMSNorm(cfg.target_hidden_size, eps=cfg.rms_norm_eps)
                                        for _ in range(cfg.num_aux))
    g = torch.Generator().manual_seed(0)
    for norm in model.model.fc_norm:
        norm.weight.data.copy_(torch.rand(cfg.target_hidden_size, generator=g) + 0.5)
    model.model.fc = nn.Linear(cfg.target_hidden_size * cfg.num_aux, cfg.hidden_size, bias=False)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fc_norm_over_all_chunks_at_once_equals_one_norm_per_chunk(vllm_ctx, dtype) -> None:
    cfg = _cfg()
    model = _bare_model(cfg).to(dtype)
    model.matmul_dtype = dtype
    aux = (torch.randn(7, cfg.target_hidden_size * cfg.num_aux) * 3).to(dtype)
    chunks = aux.chunk(cfg.num_aux, dim=-1)
    expected = model.model.fc(torch.cat([norm(c) for norm, c in zip(model.model.fc_norm, chunks)], dim=-1))
    assert torch.equal(model.combine_hidden_states(aux), expected)
    # stacked weights are cached; loading weights drops them
    model.model.fc_norm[1].weight.data.mul_(2)
    model.__dict__.pop("_fc_norm_stacked")
    chunks = aux.chunk(cfg.num_aux, dim=-1)
    expected = model.model.fc(torch.cat([norm(c) for norm, c in zip(model.model.fc_norm, chunks)], dim=-1))
    assert torch.equal(model.combine_hidden_states(aux), expected)


def test_sanitize_replaces_exactly_the_non_finite_rows_in_place_and_counts_them() -> None:
    from peagle_vllm.vllm_adapter.v1.proposer import PEagleProposer
    logits = torch.randn(3, 4, 20) * 30
    logits[0, 1, 5] = float("nan")
    logits[1, 2, 0] = float("inf")
    logits[2, 3, 7] = float("-inf")
    expected = logits.masked_fill(~torch.isfinite(logits).all(-1, keepdim=True), 0.0)
    fake = types.SimpleNamespace(_bad_rows=torch.zeros((), dtype=torch.long), num_proposals=2, _warned_bad=False)
    out = PEagleProposer._sanitize(fake, logits)
    assert torch.equal(out, expected) and out.data_ptr() == logits.data_ptr()
    assert int(fake._bad_rows) == 3


def test_sanitize_keeps_half_precision_rows_whose_sum_overflows_half() -> None:
    """float16 logits of 8,192 entries near 60 each sum past float16's 65,504: finite rows, kept as they are."""
    from peagle_vllm.vllm_adapter.v1.proposer import PEagleProposer
    logits = torch.full((1, 2, 8192), 60.0, dtype=torch.float16)
    fake = types.SimpleNamespace(_bad_rows=torch.zeros((), dtype=torch.long), num_proposals=2, _warned_bad=False)
    out = PEagleProposer._sanitize(fake, logits.clone())
    assert torch.equal(out, logits) and int(fake._bad_rows) == 0
