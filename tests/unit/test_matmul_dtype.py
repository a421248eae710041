"""The head's matmul dtype: bfloat16 only for a float32 head on a CPU with bfloat16 matmuls, under "auto"."""

from __future__ import annotations

import pytest
import torch

from peagle_vllm import matmul_dtype
from peagle_vllm.matmul_dtype import head_matmul_dtype


@pytest.mark.parametrize("capable", [True, False])
def test_auto_is_bfloat16_only_for_a_float32_head_on_a_capable_cpu(monkeypatch, capable) -> None:
    monkeypatch.setattr(matmul_dtype, "cpu_has_bf16_matmuls", lambda: capable)
    assert head_matmul_dtype("auto", "cpu", torch.float32) == (torch.bfloat16 if capable else torch.float32)
    assert head_matmul_dtype("auto", "cpu", torch.float16) == torch.float16
    assert head_matmul_dtype("auto", "cuda", torch.float32) == torch.float32
    assert head_matmul_dtype("auto", torch.device("cuda", 0), torch.bfloat16) == torch.bfloat16
    assert head_matmul_dtype("model", "cpu", torch.float32) == torch.float32


def test_an_unknown_option_is_refused() -> None:
    with pytest.raises(ValueError, match="head_matmul_dtype"):
        head_matmul_dtype("bfloat16", "cpu", torch.float32)
