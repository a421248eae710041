"""The draft head's gap bookkeeping (`vllm_adapter/v1/head_catch_up.HeadGaps`), on plain stand-ins for the
scheduler: which tokens each request's head KV misses, and how far a request about to draft moves back."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from types import SimpleNamespace

from peagle_vllm.vllm_adapter.v1.head_catch_up import HeadGaps


def test_importing_the_bookkeeping_imports_no_vllm() -> None:
    code = "import sys, peagle_vllm.vllm_adapter.v1.head_catch_up; print('vllm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_a_step_without_a_draft_grows_each_scheduled_requests_gap_and_one_with_a_draft_closes_it() -> None:
    gaps = HeadGaps()
    gaps.note_step({"a": 1, "b": 30}, drafted=False)  # b: a prompt chunk prefilled without the head
    gaps.note_step({"a": 1, "c": 1}, drafted=False)
    assert gaps.tokens == {"a": 2, "b": 30, "c": 1}
    gaps.note_step({"a": 3, "c": 1}, drafted=True)  # the head ran over a's and c's tokens: theirs are closed
    assert gaps.tokens == {"b": 30}


def test_held_steps_add_a_token_a_step_and_forgetting_drops_a_request() -> None:
    gaps = HeadGaps()
    gaps.note_step({"a": 2}, drafted=False)
    gaps.note_held(["a", "b"], steps=7)
    assert gaps.tokens == {"a": 9, "b": 7}
    gaps.forget("a")
    gaps.forget("never seen")
    assert gaps.tokens == {"b": 7}


@dataclass
class Request:
    """What `rewind` reads of a vLLM request."""

    request_id: str
    num_computed_tokens: int
    num_prompt_tokens: int = 10
    has_encoder_inputs: bool = False
    spec_token_ids: list[int] = field(default_factory=list)
    sampling_params: SimpleNamespace | None = None  # .prompt_logprobs


@dataclass
class Manager:
    """What `rewind` reads of a KV cache manager per attention type: blocks the prefix cache holds per request."""

    block_size: int = 16
    num_cached_block: dict[str, int] = field(default_factory=dict)


@dataclass
class Scheduler:
    """What `rewind` reads of vLLM's scheduler."""

    running: list[Request]
    managers: list[Manager] = field(default_factory=lambda: [Manager()])
    connector: object | None = None

    @property
    def kv_cache_manager(self) -> SimpleNamespace:
        return SimpleNamespace(coordinator=SimpleNamespace(single_type_managers=self.managers))


def _gaps(limit: int = 64, budget: int = 64, **tokens: int) -> HeadGaps:
    gaps = HeadGaps(limit, budget)
    gaps.tokens.update(tokens)
    return gaps


def test_nothing_to_catch_up_reads_nothing_of_the_scheduler() -> None:
    HeadGaps().rewind(object(), lambda rid: True)
    _gaps(limit=0, a=5).rewind(object(), lambda rid: True)


def test_a_request_about_to_draft_computes_its_gap_again_and_settles_it() -> None:
    a, b = Request("a", 100), Request("b", 100)
    gaps = _gaps(a=20, b=20)
    gaps.rewind(Scheduler([a, b]), will_draft=lambda rid: rid == "a")
    assert (a.num_computed_tokens, b.num_computed_tokens) == (80, 100), "b drafts no more than it did: untouched"
    assert gaps.tokens == {"b": 20} and gaps.caught_up == 20


def test_each_request_moves_back_up_to_its_limit_and_the_budget_is_shared() -> None:
    requests = [Request(rid, 200) for rid in "abc"]
    gaps = _gaps(limit=50, budget=60, a=100, b=10, c=30)
    gaps.rewind(Scheduler(requests), lambda rid: True)
    assert [r.num_computed_tokens for r in requests] == [180, 190, 180]  # 60 // 3 = 20 each at most
    assert gaps.tokens == {} and gaps.caught_up == 50
    one = Request("d", 200)
    _gaps(limit=50, budget=60, d=100).rewind(Scheduler([one]), lambda rid: True)
    assert one.num_computed_tokens == 150, "alone, the request's own limit binds"


def test_blocks_the_prefix_cache_holds_and_prompt_logprobs_are_never_computed_again() -> None:
    cached = Request("cached", 40)
    logprobs = Request("logprobs", 40, num_prompt_tokens=35, sampling_params=SimpleNamespace(prompt_logprobs=1))
    everything = Request("everything", 5)
    managers = [Manager(16, {"cached": 2}), Manager(8, {"cached": 3})]  # 32 and 24 tokens cached: 32 stand
    gaps = _gaps(cached=20, logprobs=20, everything=20)
    gaps.rewind(Scheduler([cached, logprobs, everything], managers), lambda rid: True)
    assert (cached.num_computed_tokens, logprobs.num_computed_tokens) == (32, 35)
    assert everything.num_computed_tokens == 1, "at least one token stays computed"
    assert gaps.tokens == {} and gaps.caught_up == 8 + 5 + 4


def test_requests_with_encoder_inputs_or_pending_drafts_and_engines_with_a_kv_connector_are_left_alone() -> None:
    encoder, drafts = Request("encoder", 100, has_encoder_inputs=True), Request("drafts", 100, spec_token_ids=[1, 2])
    gaps = _gaps(encoder=20, drafts=20)
    gaps.rewind(Scheduler([encoder, drafts]), lambda rid: True)
    assert (encoder.num_computed_tokens, drafts.num_computed_tokens) == (100, 100)
    assert gaps.tokens == {"encoder": 20, "drafts": 20} and gaps.caught_up == 0
    plain = Request("plain", 100)
    _gaps(plain=20).rewind(Scheduler([plain], connector=object()), lambda rid: True)
    assert plain.num_computed_tokens == 100
