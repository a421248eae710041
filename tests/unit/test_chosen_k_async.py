"""`peagle:chosen_k` is fed under async scheduling too: drafts then go from the worker to the next step without
the scheduler's update_draft_token_ids, so each request's K is counted from the drafts a step verifies (vLLM's CPU
backend forces synchronous scheduling, so the hook runs here on vLLM's real SchedulerOutput and
ModelRunnerOutput)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.v1.core.sched.output import SchedulerOutput  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402

from peagle_vllm.config import PEagleOptions  # noqa: E402
from peagle_vllm.head import HeadConfig  # noqa: E402
from peagle_vllm.vllm_adapter.v1.carriers import PEagleMark  # noqa: E402
from peagle_vllm.vllm_adapter.v1.scheduler_hook import wrap_update_from_output  # noqa: E402
from peagle_vllm.vllm_adapter.v1.scheduler_state import STATE_ATTR, SchedulerState  # noqa: E402

HEAD = HeadConfig(hidden_size=64, vocab_size=256, draft_vocab_size=256, intermediate_size=128, num_attention_heads=4,
                  num_key_value_heads=2, aux_layer_ids=[1, 2, 3], mask_token_id=0)


class Scheduler:
    """The attributes the hook reads; vLLM's own update_from_output stands behind it."""

    def __init__(self, async_scheduling: bool) -> None:
        self.requests = {"a": object(), "b": object()}
        mark = PEagleMark(PEagleOptions(model="head", num_speculative_tokens=4, adaptive=False), HEAD)
        setattr(self, STATE_ATTR, SchedulerState(self, mark, adaptive=False, async_scheduling=async_scheduling))

    def update_from_output(self, scheduler_output, model_runner_output):
        return {}


def _step(drafts: dict[str, int]) -> tuple[SchedulerOutput, ModelRunnerOutput]:
    out = SchedulerOutput.make_empty()
    out.num_scheduled_tokens = {rid: 1 + k for rid, k in drafts.items()}
    out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
    out.scheduled_spec_decode_tokens = {rid: [-1] * k for rid, k in drafts.items() if k}  # async placeholders
    ids = list(drafts)
    return out, ModelRunnerOutput(req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
                                  sampled_token_ids=[[7] for _ in ids])


def test_async_scheduling_counts_each_requests_verified_drafts() -> None:
    scheduler = Scheduler(async_scheduling=True)
    update = wrap_update_from_output(Scheduler.update_from_output)
    update(scheduler, *_step({"a": 4, "b": 4}))
    update(scheduler, *_step({"a": 4, "b": 0}))  # b's first decode step: nothing to verify yet
    assert getattr(scheduler, STATE_ATTR).figures.chosen_k == {4: 3}


def test_synchronous_scheduling_leaves_the_count_to_update_draft_token_ids() -> None:
    scheduler = Scheduler(async_scheduling=False)
    wrap_update_from_output(Scheduler.update_from_output)(scheduler, *_step({"a": 4, "b": 4}))
    assert getattr(scheduler, STATE_ATTR).figures.chosen_k == {}
