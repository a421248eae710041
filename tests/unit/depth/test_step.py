"""An engine step as the controller sees it (`peagle_vllm.depth.step`)."""

from __future__ import annotations

from peagle_vllm.depth.step import Step


def test_a_step_is_decode_only_when_each_request_computed_one_token_and_its_drafts() -> None:
    assert Step(tokens=4, draft_rows=0, seconds=0.01, requests=4).decode_only
    assert Step(tokens=10, draft_rows=24, seconds=0.01, requests=4, verified=6).decode_only
    assert not Step(tokens=120, draft_rows=0, seconds=0.01, requests=4).decode_only, "a prompt in the step"
    assert not Step(tokens=10, draft_rows=24, seconds=0.01, requests=4, verified=5).decode_only
