"""The replayed engine (`peagle_vllm.harness.depth_replay`) on hand-checkable acceptance and costs."""

from __future__ import annotations

import pytest

from peagle_vllm.depth import DepthController, DepthOptions
from peagle_vllm.harness.depth_replay import PREFILL_MS_PER_TOKEN, Noise, Request, StepCosts, hooks_share, replay

QUIET = {"step": 0.0, "drift": 0.0}


def flat_costs(plain_ms: float, draft_ms: float) -> StepCosts:
    flat = [(0.0, draft_ms), (64.0, draft_ms)]
    return StepCosts({1: plain_ms, 4: plain_ms}, {1: flat, 4: flat})


def requests(n: int, run: int, tokens: int = 61) -> list[Request]:
    return [Request(f"r{i}", 0, [run] * tokens) for i in range(n)]


def test_fixed_k_and_plain_decoding_cost_what_the_table_says() -> None:
    """61 tokens: plain, 61 steps of 10 ms; K=4 with every draft right, one step that drafts (15 ms, its
    first token) and 12 that verify 4 drafts each (5 tokens, 15 ms)."""
    costs = flat_costs(10.0, 5.0)
    assert replay(requests(1, 32), 1, costs, 61, Noise(**QUIET)) == pytest.approx(61 / 0.61)
    assert replay(requests(1, 32), 1, costs, 61, Noise(**QUIET), fixed_k=4) == pytest.approx(61 / 0.195)
    # a draft never right: every step emits one token at 15 ms
    assert replay(requests(1, 0), 1, costs, 61, Noise(**QUIET), fixed_k=4) == pytest.approx(61 / (61 * 0.015))


def test_costs_interpolate_between_batch_sizes_and_scale_beyond() -> None:
    costs = StepCosts({1: 4.0, 4: 8.0}, {1: [(0.0, 1.0), (8.0, 3.0)], 4: [(0.0, 2.0), (8.0, 6.0)]})
    assert costs.step_ms(2, 0, 0, 0) == pytest.approx(6.0)  # halfway on log(batch)
    assert costs.step_ms(1, 2, 1, 0) == pytest.approx(4.0 + 1.0 + 2.0 * 4 / 8)  # x = 2 x 2 verified
    assert costs.step_ms(8, 0, 0, 0) == pytest.approx(16.0)


def test_prompt_tokens_cost_the_target_and_the_head_when_a_draft_runs() -> None:
    costs = StepCosts({1: 4.0}, {1: [(0.0, 1.0), (8.0, 3.0)]}, head_prompt_ms=0.05)
    assert costs.step_ms(1, 0, 0, 100) == pytest.approx(4.0 + 100 * PREFILL_MS_PER_TOKEN)
    assert costs.step_ms(1, 0, 4, 100) == pytest.approx(4.0 + 1.0 + 100 * (PREFILL_MS_PER_TOKEN + 0.05))


def test_adaptive_depth_pays_its_hooks_per_step() -> None:
    """A controller in fallback (drafts never right, drafting dear; no probe for 10,000 steps) runs plain
    steps plus the hooks' time, their share of a plain step at batch 1, once its first trial is over."""
    costs = flat_costs(10.0, 50.0)
    plain = replay(requests(1, 0), 1, costs, 61, Noise(**QUIET))
    ctrl = DepthController(DepthOptions(max_k=4, probe_every=10_000))
    replay(requests(1, 0), 1, costs, 61, Noise(**QUIET), ctrl)  # the engine's first trial happens here
    settled = replay([Request("late", 0, [0] * 61)], 1, costs, 61, Noise(**QUIET), ctrl)
    assert settled == pytest.approx(plain / (1.0 + hooks_share(1, drafts=False)))


def test_hooks_cost_their_share_of_the_step_by_batch_size_and_kind() -> None:
    """Steps that draft pay more hooks than plain ones; shares interpolate on log(batch), the ends hold beyond."""
    assert hooks_share(1, drafts=True) > hooks_share(1, drafts=False)
    assert hooks_share(2, drafts=False) == pytest.approx((hooks_share(1, False) + hooks_share(4, False)) / 2)
    assert hooks_share(256, drafts=False) == hooks_share(64, drafts=False)


def test_the_controller_settles_on_the_side_that_pays() -> None:
    """Drafts never right and drafting dear: adaptive depth stays near plain decoding's speed; every
    draft right and drafting cheap: near the best fixed K (0.92 of it over an engine's life of some 130 steps, in
    which the plain steps that check the opening trial cost 3%)."""
    dear, cheap = flat_costs(10.0, 10.0), flat_costs(10.0, 1.0)
    ctrl = DepthController(DepthOptions(max_k=8))
    plain = replay(requests(64, 0), 1, dear, 61, Noise(**QUIET))
    assert replay(requests(64, 0), 1, dear, 61, Noise(**QUIET), controller=ctrl) > 0.9 * plain
    ctrl = DepthController(DepthOptions(max_k=8))
    best = max(replay(requests(64, 32), 4, cheap, 61, Noise(**QUIET), fixed_k=k) for k in (1, 2, 4, 8))
    assert replay(requests(64, 32), 4, cheap, 61, Noise(**QUIET), controller=ctrl) > 0.88 * best


def test_noise_is_repeatable_and_centred() -> None:
    a, b = Noise(seed=3), Noise(seed=3)
    factors = [a.factor() for _ in range(5000)]
    assert factors[:50] == [b.factor() for _ in range(50)]
    assert 0.85 < sum(factors) / len(factors) < 1.15
