"""The worker's draft time reaches the scheduler under async scheduling too (vLLM's CPU backend forces it off,
so the sample_tokens hook runs here on vLLM's real output classes): an AsyncModelRunnerOutput carries it once its
result is read, the timer is drained every step, and vLLM's shared empty output is never written to."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, AsyncModelRunnerOutput, ModelRunnerOutput  # noqa: E402

from peagle_vllm.timing import SectionTimer  # noqa: E402
from peagle_vllm.vllm_adapter.v1 import carriers  # noqa: E402
from peagle_vllm.vllm_adapter.v1.runner_hook import wrap_sample_tokens  # noqa: E402


class AsyncOutput(AsyncModelRunnerOutput):
    """A step's output whose result is read later, as the GPU runner's under async scheduling."""

    def __init__(self) -> None:
        self.result = ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0})

    def get_output(self) -> ModelRunnerOutput:
        return self.result


class Drafter:
    def __init__(self) -> None:
        self.draft_timer = SectionTimer("cpu")


class Runner:
    """The attributes the hook reads; `sample_tokens` returns the queued outputs in turn, one draft per step."""

    def __init__(self, outputs: list) -> None:
        self.drafter, self.outputs = Drafter(), outputs

    def sample_tokens(self, grammar_output=None):
        with self.drafter.draft_timer.section():
            pass
        return self.outputs.pop(0)


def test_async_outputs_carry_the_draft_time_and_the_timer_is_drained_every_step() -> None:
    first, second = AsyncOutput(), AsyncOutput()
    runner = Runner([first, EMPTY_MODEL_RUNNER_OUTPUT, second])
    sample_tokens = wrap_sample_tokens(Runner.sample_tokens)
    assert sample_tokens(runner) is first
    assert runner.drafter.draft_timer.take() == (0, 0.0)  # drained by the step
    assert sample_tokens(runner) is EMPTY_MODEL_RUNNER_OUTPUT  # an idle step: the draft waits for the next output
    assert carriers.draft_time(EMPTY_MODEL_RUNNER_OUTPUT) == (0, 0.0)
    assert sample_tokens(runner) is second
    assert carriers.draft_time(first.get_output())[0] == 1
    assert carriers.draft_time(second.get_output())[0] == 2  # the idle step's draft and its own


def test_a_synchronous_output_carries_the_draft_time_at_once() -> None:
    out = ModelRunnerOutput(req_ids=["r"], req_id_to_index={"r": 0})
    runner = Runner([out])
    wrap_sample_tokens(Runner.sample_tokens)(runner)
    runs, seconds = carriers.draft_time(out)
    assert runs == 1 and seconds >= 0.0
