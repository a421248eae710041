"""The draft rows' greedy tokens (`vllm_adapter.v1.sampler.greedy_tokens`): the same token as torch's argmax, read
from the logits in place, in float32 (vLLM's CPU kernel, as plain greedy decoding reads it) and in other dtypes."""
import pytest
import torch


@pytest.fixture
def greedy_tokens():
    pytest.importorskip("vllm")
    import vllm._custom_ops  # noqa: F401  (the CPU sampler's kernels)

    from peagle_vllm.vllm_adapter.v1.sampler import greedy_tokens

    return greedy_tokens


def test_each_row_gets_its_argmax_the_first_of_a_tie(greedy_tokens) -> None:
    logits = torch.randn(40, 49152, generator=torch.Generator().manual_seed(0))
    logits[3, 7] = logits[3, 900] = 50.0  # a tie: the first wins, as in torch and plain decoding
    expected = logits.argmax(-1)
    assert expected[3] == 7
    assert torch.equal(greedy_tokens(logits), expected)
    assert greedy_tokens(logits).dtype == torch.int64


def test_rows_of_a_larger_tensor_and_half_precision_logits(greedy_tokens) -> None:
    logits = torch.randn(24, 3000, generator=torch.Generator().manual_seed(1))
    assert torch.equal(greedy_tokens(logits[::3]), logits[::3].argmax(-1)), "strided rows"
    half = logits.to(torch.bfloat16)
    assert torch.equal(greedy_tokens(half), half.float().argmax(-1)), "bfloat16 logits (no float32 kernel)"

