"""`harness.profile_step.decode_steps`: which engine steps a profile counts as decode steps."""
from peagle_vllm.harness.profile_step import decode_steps


def _steps(*tokens: int) -> list[dict[str, float]]:
    return [{"forward tokens": n, "step": 0.01} for n in tokens]


def test_one_request_plain_counts_single_token_steps_only() -> None:
    assert [s["forward tokens"] for s in decode_steps(_steps(41, 1, 1, 1), 1, 0)] == [1, 1, 1]


def test_a_batch_at_k4_keeps_steps_of_batch_to_five_tokens_a_request() -> None:
    steps = _steps(700, 16, 80, 81, 57, 12, 3)  # a prefill, decode steps, one over 5 a request, a ragged end
    assert [s["forward tokens"] for s in decode_steps(steps, 16, 4)] == [16, 80, 57]


def test_a_step_without_a_forward_is_not_a_decode_step() -> None:
    assert decode_steps([{"step": 0.01}], 1, 4) == []
