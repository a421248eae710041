"""The dtype of the draft head's matrix multiplies (fc, attention projections, MLP, output layer).

Rule: `"auto"` runs them in bfloat16 where the head's weights are float32 on a CPU with bfloat16 matmul
instructions (AVX512-BF16 or AMX): a draft's matmuls are reads of the head's weights (a few rows each), which
bfloat16 halves, and the heads are trained under bfloat16 autocast (docs/smollm2-results.md has the
measurement). Elsewhere, and under `"model"`, they run in the head's own dtype (the target's). The drafts may
differ a little, the output never: verification is exact whatever is drafted.
"""

from __future__ import annotations

import torch

MATMUL_DTYPES = ("auto", "model")


def cpu_has_bf16_matmuls() -> bool:
    """This CPU multiplies bfloat16 matrices natively (AVX512-BF16 or AMX tiles)."""
    return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def head_matmul_dtype(option: str, device: torch.device | str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype the head's matmuls run in, by the module's rule; `option`: one of `MATMUL_DTYPES`."""
    if option not in MATMUL_DTYPES:
        raise ValueError(f"head_matmul_dtype must be one of {MATMUL_DTYPES}, got {option!r}")
    if (option == "auto" and torch.device(device).type == "cpu" and model_dtype == torch.float32
            and cpu_has_bf16_matmuls()):
        return torch.bfloat16
    return model_dtype
